//! The session `ConfigProto`, encoded by hand: a handful of varint fields and
//! one small nested message is all isorun sets, and a generated crate for
//! TensorFlow's protos would cost more than it saves.

use isorun_protocol::SessionConfig;

/// `ConfigProto.intra_op_parallelism_threads`.
const INTRA_OP_FIELD: u32 = 2;
/// `ConfigProto.inter_op_parallelism_threads`.
const INTER_OP_FIELD: u32 = 5;
/// `ConfigProto.gpu_options` (a `GPUOptions` message).
const GPU_OPTIONS_FIELD: u32 = 6;
/// `GPUOptions.per_process_gpu_memory_fraction` (a double).
const GPU_MEMORY_FRACTION_FIELD: u32 = 1;
/// `GPUOptions.allow_growth` (a bool).
const GPU_ALLOW_GROWTH_FIELD: u32 = 4;

/// `ConfigProto.graph_options` (a `GraphOptions` message).
const GRAPH_OPTIONS_FIELD: u32 = 10;
/// `GraphOptions.rewrite_options` (a `RewriterConfig` message).
const REWRITE_OPTIONS_FIELD: u32 = 10;
/// `RewriterConfig.disable_meta_optimizer` (a bool).
const DISABLE_META_OPTIMIZER_FIELD: u32 = 19;

/// `ConfigProto.device_count` (a `map<string, int32>`: entries with key 1, value 2).
const DEVICE_COUNT_FIELD: u32 = 1;

/// Protobuf wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;

/// Serialized `tensorflow.ConfigProto` for `TF_SetConfig`. Fields left at
/// their defaults (0, false, unset) are omitted, as protobuf does, so
/// TensorFlow chooses for them; so is `gpu_options` when it would be empty.
pub fn session_config_proto(config: &SessionConfig) -> Vec<u8> {
    let mut out = Vec::new();
    if config.intra_op_threads > 0 {
        put_varint_field(&mut out, INTRA_OP_FIELD, u64::from(config.intra_op_threads));
    }
    if config.ops_on_caller_thread {
        // An int32 of -1: protobuf sign-extends negative int32s to 64 bits.
        put_varint_field(&mut out, INTER_OP_FIELD, -1i64 as u64);
    } else if config.inter_op_threads > 0 {
        put_varint_field(&mut out, INTER_OP_FIELD, u64::from(config.inter_op_threads));
    }
    let gpu_options = gpu_options_proto(config);
    if !gpu_options.is_empty() {
        put_key(&mut out, GPU_OPTIONS_FIELD, LENGTH_DELIMITED);
        put_varint(&mut out, gpu_options.len() as u64);
        out.extend_from_slice(&gpu_options);
    }
    if config.skip_grappler {
        let mut rewrite_options = Vec::new();
        put_varint_field(&mut rewrite_options, DISABLE_META_OPTIMIZER_FIELD, 1);
        let mut graph_options = Vec::new();
        put_key(&mut graph_options, REWRITE_OPTIONS_FIELD, LENGTH_DELIMITED);
        put_varint(&mut graph_options, rewrite_options.len() as u64);
        graph_options.extend_from_slice(&rewrite_options);
        put_key(&mut out, GRAPH_OPTIONS_FIELD, LENGTH_DELIMITED);
        put_varint(&mut out, graph_options.len() as u64);
        out.extend_from_slice(&graph_options);
    }
    out
}

/// [`session_config_proto`] with `device_count { "GPU": 0 }`: a session
/// that makes no GPU device, so the process creates no CUDA context (a
/// spare's warm-up, before its unit runs on the slot's device).
pub fn cpu_only_config_proto(config: &SessionConfig) -> Vec<u8> {
    let mut entry = Vec::new();
    put_key(&mut entry, 1, LENGTH_DELIMITED);
    put_varint(&mut entry, 3);
    entry.extend_from_slice(b"GPU");
    put_varint_field(&mut entry, 2, 0);
    let mut out = Vec::new();
    put_key(&mut out, DEVICE_COUNT_FIELD, LENGTH_DELIMITED);
    put_varint(&mut out, entry.len() as u64);
    out.extend_from_slice(&entry);
    out.extend_from_slice(&session_config_proto(config));
    out
}

/// Serialized `tensorflow.GPUOptions`: the memory fraction, then allow_growth.
fn gpu_options_proto(config: &SessionConfig) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(fraction) = config.gpu_memory_fraction.filter(|f| *f != 0.0) {
        put_key(&mut out, GPU_MEMORY_FRACTION_FIELD, FIXED64);
        out.extend_from_slice(&fraction.to_le_bytes());
    }
    if config.gpu_allow_growth {
        put_varint_field(&mut out, GPU_ALLOW_GROWTH_FIELD, 1);
    }
    out
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u64) {
    put_varint(out, (u64::from(field) << 3) | wire_type);
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    put_key(out, field, VARINT);
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
        #[prost(message, optional, tag = "6")]
        gpu_options: Option<GpuOptions>,
        #[prost(map = "string, int32", tag = "1")]
        device_count: std::collections::HashMap<String, i32>,
        #[prost(message, optional, tag = "10")]
        graph_options: Option<GraphOptions>,
    }

    /// The field of TensorFlow's `GraphOptions` this module writes.
    #[derive(Clone, PartialEq, prost::Message)]
    struct GraphOptions {
        #[prost(message, optional, tag = "10")]
        rewrite_options: Option<RewriterConfig>,
    }

    /// The field of TensorFlow's `RewriterConfig` this module writes.
    #[derive(Clone, PartialEq, prost::Message)]
    struct RewriterConfig {
        #[prost(bool, tag = "19")]
        disable_meta_optimizer: bool,
    }

    /// The fields of TensorFlow's `GPUOptions` this module writes.
    #[derive(Clone, PartialEq, prost::Message)]
    struct GpuOptions {
        #[prost(double, tag = "1")]
        per_process_gpu_memory_fraction: f64,
        #[prost(bool, tag = "4")]
        allow_growth: bool,
    }

    fn threads(intra: u32, inter: u32) -> SessionConfig {
        SessionConfig { intra_op_threads: intra, inter_op_threads: inter, ..SessionConfig::default() }
    }

    #[test]
    fn a_cpu_only_config_counts_no_gpu_and_keeps_the_rest() {
        let config = SessionConfig { gpu_memory_fraction: Some(0.25), ..threads(3, 2) };
        let decoded = ConfigProto::decode(cpu_only_config_proto(&config).as_slice()).unwrap();
        assert_eq!(decoded.device_count, [("GPU".to_string(), 0)].into_iter().collect());
        assert_eq!((decoded.intra_op_parallelism_threads, decoded.inter_op_parallelism_threads), (3, 2));
        assert_eq!(decoded.gpu_options.unwrap().per_process_gpu_memory_fraction, 0.25);
        let plain = ConfigProto::decode(session_config_proto(&config).as_slice()).unwrap();
        assert!(plain.device_count.is_empty());
    }

    #[test]
    fn thread_counts_encode_as_tensorflow_reads_them() {
        let bytes = session_config_proto(&threads(2, 300));
        assert_eq!(bytes, [0x10, 2, 0x28, 0xac, 0x02]);
        let back = ConfigProto::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.intra_op_parallelism_threads, 2);
        assert_eq!(back.inter_op_parallelism_threads, 300);
        assert_eq!(back.gpu_options, None);
    }

    #[test]
    fn skipping_grappler_disables_the_meta_optimizer_and_keeps_the_rest() {
        let config = SessionConfig { skip_grappler: true, ..threads(2, 2) };
        let bytes = session_config_proto(&config);
        // ... field 10, length 5, { field 10, length 3, { field 19 (varint): 1 } }: as
        // Python's `ConfigProto(graph_options=...disable_meta_optimizer=True)` serializes it.
        assert_eq!(bytes[4..], [0x52, 0x05, 0x52, 0x03, 0x98, 0x01, 0x01]);
        let back = ConfigProto::decode(bytes.as_slice()).unwrap();
        assert_eq!((back.intra_op_parallelism_threads, back.inter_op_parallelism_threads), (2, 2));
        let rewrite = back.graph_options.and_then(|g| g.rewrite_options).expect("rewrite_options");
        assert!(rewrite.disable_meta_optimizer);
        let cpu_only = ConfigProto::decode(cpu_only_config_proto(&config).as_slice()).unwrap();
        assert!(cpu_only.graph_options.and_then(|g| g.rewrite_options).is_some_and(|r| r.disable_meta_optimizer));
        // Off by default: no graph options at all.
        let plain = ConfigProto::decode(session_config_proto(&threads(2, 2)).as_slice()).unwrap();
        assert_eq!(plain.graph_options, None);
    }

    #[test]
    fn defaults_encode_to_nothing() {
        assert!(session_config_proto(&SessionConfig::default()).is_empty());
    }

    #[test]
    fn ops_on_the_caller_s_thread_are_a_negative_inter_op_count() {
        let config = SessionConfig { ops_on_caller_thread: true, ..threads(2, 8) };
        let back = ConfigProto::decode(session_config_proto(&config).as_slice()).unwrap();
        assert_eq!((back.intra_op_parallelism_threads, back.inter_op_parallelism_threads), (2, -1));
    }

    #[test]
    fn allow_growth_is_a_nested_gpu_options_message() {
        let config = SessionConfig { gpu_allow_growth: true, ..threads(4, 4) };
        let bytes = session_config_proto(&config);
        // ... field 6, length 2, { field 4 (varint): 1 }
        assert_eq!(bytes, [0x10, 4, 0x28, 4, 0x32, 2, 0x20, 1]);
        let back = ConfigProto::decode(bytes.as_slice()).unwrap();
        assert_eq!((back.intra_op_parallelism_threads, back.inter_op_parallelism_threads), (4, 4));
        let gpu = back.gpu_options.expect("gpu_options");
        assert!(gpu.allow_growth);
        assert_eq!(gpu.per_process_gpu_memory_fraction, 0.0);
    }

    #[test]
    fn memory_fraction_is_a_double_in_gpu_options() {
        let config = SessionConfig { gpu_memory_fraction: Some(0.4), ..SessionConfig::default() };
        let bytes = session_config_proto(&config);
        let mut expected = vec![0x32, 9, 0x09];
        expected.extend_from_slice(&0.4f64.to_le_bytes());
        assert_eq!(bytes, expected);
        let gpu = ConfigProto::decode(bytes.as_slice()).unwrap().gpu_options.expect("gpu_options");
        assert_eq!(gpu.per_process_gpu_memory_fraction, 0.4);
        assert!(!gpu.allow_growth);
    }

    #[test]
    fn both_gpu_options_together() {
        let config = SessionConfig { gpu_allow_growth: true, gpu_memory_fraction: Some(1.0), ..threads(0, 7) };
        let back = ConfigProto::decode(session_config_proto(&config).as_slice()).unwrap();
        assert_eq!((back.intra_op_parallelism_threads, back.inter_op_parallelism_threads), (0, 7));
        assert_eq!(back.gpu_options, Some(GpuOptions { per_process_gpu_memory_fraction: 1.0, allow_growth: true }));
    }

    #[test]
    fn unset_gpu_options_are_left_out() {
        let config = SessionConfig { gpu_allow_growth: false, gpu_memory_fraction: Some(0.0), ..threads(1, 1) };
        assert_eq!(session_config_proto(&config), [0x10, 1, 0x28, 1]);
    }
}
