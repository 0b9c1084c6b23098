//! The session `ConfigProto`, encoded by hand: a handful of varint fields is
//! all isorun sets, and a generated crate for TensorFlow's protos would cost
//! more than it saves.

use isorun_protocol::SessionConfig;

/// `ConfigProto.intra_op_parallelism_threads`.
const INTRA_OP_FIELD: u32 = 2;
/// `ConfigProto.inter_op_parallelism_threads`.
const INTER_OP_FIELD: u32 = 5;

/// Serialized `tensorflow.ConfigProto` for `TF_SetConfig`. Fields left at 0
/// are omitted, as protobuf does, so TensorFlow chooses for them.
pub fn session_config_proto(config: &SessionConfig) -> Vec<u8> {
    let mut out = Vec::new();
    if config.intra_op_threads > 0 {
        put_varint_field(&mut out, INTRA_OP_FIELD, u64::from(config.intra_op_threads));
    }
    if config.inter_op_threads > 0 {
        put_varint_field(&mut out, INTER_OP_FIELD, u64::from(config.inter_op_threads));
    }
    out
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    put_varint(out, u64::from(field) << 3); // wire type 0: varint
    put_varint(out, value);
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The fields of TensorFlow's `ConfigProto` this module writes, decoded by
    /// prost as an independent check.
    #[derive(Clone, PartialEq, prost::Message)]
    struct ConfigProto {
        #[prost(int32, tag = "2")]
        intra_op_parallelism_threads: i32,
        #[prost(int32, tag = "5")]
        inter_op_parallelism_threads: i32,
    }

    #[test]
    fn thread_counts_encode_as_tensorflow_reads_them() {
        let bytes = session_config_proto(&SessionConfig { intra_op_threads: 2, inter_op_threads: 300 });
        assert_eq!(bytes, [0x10, 2, 0x28, 0xac, 0x02]);
        let back = ConfigProto::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.intra_op_parallelism_threads, 2);
        assert_eq!(back.inter_op_parallelism_threads, 300);
    }

    #[test]
    fn defaults_encode_to_nothing() {
        assert!(session_config_proto(&SessionConfig::default()).is_empty());
    }
}
