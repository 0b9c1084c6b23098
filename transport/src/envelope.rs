//! The `ipc-channel` message that carries a request to a worker: the request
//! itself as bincode bytes, plus the shared-memory regions its large tensors
//! live in (which only `ipc-channel`'s own serializer can carry).

use ipc_channel::ipc::IpcSharedMemory;
use isorun_protocol::{Tensor, TensorData, ToWorker};
use serde::{Deserialize, Serialize};

use crate::frame::{decode, encode, FrameError};

/// Dense tensors at least this large travel in shared memory.
pub const SHARED_THRESHOLD: usize = 64 * 1024;

/// A `ToWorker` message and the shared memory its tensors refer to.
#[derive(Serialize, Deserialize)]
pub struct RequestEnvelope {
    #[serde(with = "serde_bytes")]
    message: Vec<u8>,
    shared: Vec<IpcSharedMemory>,
}

impl RequestEnvelope {
    /// Packs a message whose `TensorData::Shared(i)` refer to `shared[i]`.
    pub fn new(message: &ToWorker, shared: Vec<IpcSharedMemory>) -> RequestEnvelope {
        RequestEnvelope { message: encode(message), shared }
    }

    /// Unpacks the message, checking every tensor against its data.
    pub fn open(self) -> Result<(ToWorker, Vec<IpcSharedMemory>), FrameError> {
        let message: ToWorker = decode(&self.message)?;
        if let ToWorker::Run(request) = &message {
            for (name, tensor) in &request.inputs {
                tensor
                    .validate(|i| self.shared.get(i as usize).map(|s| s.len() as u64))
                    .map_err(|e| FrameError::Decode(format!("input {name}: {e}")))?;
            }
        }
        Ok((message, self.shared))
    }
}

/// The bytes of a dense tensor, wherever they are.
pub fn dense_bytes<'a>(tensor: &'a Tensor, shared: &'a [IpcSharedMemory]) -> Option<&'a [u8]> {
    match &tensor.data {
        TensorData::Dense(bytes) => Some(bytes),
        TensorData::Shared(i) => shared.get(*i as usize).map(|s| &s[..]),
        TensorData::Strings(_) => None,
    }
}
