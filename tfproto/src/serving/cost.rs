//! The most memory prost may take to decode one warm-up record, found by
//! walking the record's wire format before anything is decoded. A protobuf
//! element costs more in memory than on the wire: an empty `tf.Example` is
//! 2 bytes on the wire and a 24-byte `Vec` in a list that doubles as it
//! grows; an input-map entry of 5 bytes is a `TensorProto` of about 300
//! bytes in a B-tree node of 11 slots. So a record is charged for every
//! element and entry it holds, and one whose charge is over its budget is
//! refused before prost allocates any of it.
//!
//! Decisions:
//! - The walk knows the fields of [`super::proto`] and nothing else: unknown
//!   fields (and a wrong wire type on a known one) cost nothing, as prost
//!   skips (or refuses) them without keeping anything.
//! - Every occurrence is charged, even where prost would merge or replace:
//!   the charge is an upper bound, never an estimate.
//! - A repeated message or bytes element costs [`VEC_SLOTS`] times its
//!   size (a `Vec` that doubles holds up to twice its length, three times
//!   while it moves; the first push makes room for four); a map entry
//!   [`MAP_SLOTS`] times (a B-tree node of 11 slots may hold one entry);
//!   bytes and strings their length, and the largest of them once more
//!   (prost copies a `bytes` field through a temporary buffer).
//! - A repeated number is charged per element, not per wire byte: a packed
//!   varint field holds one element per byte with the high bit clear (a
//!   token id below 30000 is 2 or 3 bytes on the wire and 8 in memory; at 32
//!   bytes a wire byte, an honest 1.3 MB warm-up of 128 × 4096 int64 token
//!   ids was over its budget), a packed fixed-width one its length over the
//!   width, an unpacked one an element per occurrence. prost 0.13 pushes
//!   them one at a time, reserving nothing, into a `Vec` that grows as std
//!   grows one ([`vec_capacity`]: 4 slots first, 8 for bytes, then
//!   doubling); all a `TensorProto`'s occurrences of a field are one `Vec`
//!   (summed per map entry, where prost merges them), charged its final
//!   capacity, and the largest `Vec`'s block before its last growth once
//!   more (a realloc may copy: old and new live at once, one `Vec` at a
//!   time).
//! - Where the wire format breaks, the walk stops: prost stops there too,
//!   with an error, having allocated at most what was charged so far.

use super::proto;
use std::mem::size_of;

/// A repeated field's element costs this many times its size.
pub(crate) const VEC_SLOTS: u64 = 4;

/// A map entry costs this many times its key and value.
pub(crate) const MAP_SLOTS: u64 = 12;

/// The messages a warm-up record may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    PredictionLog,
    PredictLog,
    /// `ClassifyLog` and `RegressLog`.
    ExamplesLog,
    MultiInferenceLog,
    ModelSpec,
    PredictRequest,
    /// An entry of `PredictRequest.inputs`.
    InputsEntry,
    ExamplesRequest,
    MultiInferenceRequest,
    InferenceTask,
    Input,
    ExampleList,
    ExampleListWithContext,
    TensorProto,
    TensorShapeProto,
    Dim,
}

/// What a field of a message is, for its cost.
#[derive(Debug, Clone, Copy)]
enum Field {
    /// A message held in its parent (an optional field, a oneof): only what it holds costs.
    Inline(Message),
    /// An element of a repeated message field or a map entry: `cost` bytes, and what it holds.
    Element(Message, u64),
    /// A string or bytes field: its length.
    Bytes,
    /// An element of a repeated bytes field: a `Vec` in the list, and its length.
    BytesElement,
    /// A repeated number: `size` bytes in memory; `fixed` bytes each on
    /// the wire (float, double), or a varint (`None`).
    Numbers { size: u64, fixed: Option<u64> },
}

/// The field `tag` of `message`, where it is one prost keeps.
fn field(message: Message, tag: u64) -> Option<Field> {
    use Field::{Bytes, BytesElement, Element, Inline, Numbers};
    use Message as M;
    let vec_element = |size: usize| VEC_SLOTS * size as u64;
    Some(match (message, tag) {
        (M::PredictionLog, 2 | 3) => Inline(M::ExamplesLog),
        (M::PredictionLog, 4) => Inline(M::MultiInferenceLog),
        (M::PredictionLog, 6) => Inline(M::PredictLog),
        (M::PredictLog, 1) => Inline(M::PredictRequest),
        (M::ExamplesLog, 1) => Inline(M::ExamplesRequest),
        (M::MultiInferenceLog, 1) => Inline(M::MultiInferenceRequest),
        (M::PredictRequest | M::ExamplesRequest | M::InferenceTask, 1) => Inline(M::ModelSpec),
        (M::PredictRequest, 2) => Element(M::InputsEntry, MAP_SLOTS * size_of::<(String, proto::TensorProto)>() as u64),
        (M::InputsEntry, 1) | (M::ModelSpec, 1 | 3) | (M::InferenceTask, 2) => Bytes,
        (M::InputsEntry, 2) => Inline(M::TensorProto),
        (M::ExamplesRequest | M::MultiInferenceRequest, 2) => Inline(M::Input),
        (M::MultiInferenceRequest, 1) => Element(M::InferenceTask, vec_element(size_of::<proto::InferenceTask>())),
        (M::Input, 1) => Inline(M::ExampleList),
        (M::Input, 2) => Inline(M::ExampleListWithContext),
        (M::ExampleList | M::ExampleListWithContext, 1) | (M::TensorProto, 8) => BytesElement,
        (M::ExampleListWithContext, 2) | (M::TensorProto, 4) => Bytes,
        (M::TensorProto, 2) => Inline(M::TensorShapeProto),
        (M::TensorProto, 5) => Numbers { size: 4, fixed: Some(4) },
        (M::TensorProto, 6) => Numbers { size: 8, fixed: Some(8) },
        (M::TensorProto, 7 | 13 | 16) => Numbers { size: 4, fixed: None },
        (M::TensorProto, 10 | 17) => Numbers { size: 8, fixed: None },
        (M::TensorProto, 11) => Numbers { size: 1, fixed: None },
        (M::TensorShapeProto, 2) => Element(M::Dim, vec_element(size_of::<proto::Dim>())),
        _ => return None,
    })
}

/// At most the bytes prost allocates decoding `record` as a `PredictionLog`.
pub(crate) fn decode_cost(record: &[u8]) -> u64 {
    let (mut once_more, mut numbers) = (0, Numbers::default());
    let cost = walk(Message::PredictionLog, record, &mut once_more, &mut numbers);
    cost.saturating_add(numbers.cost(&mut once_more)).saturating_add(once_more)
}

/// The elements of each repeated number field of one decoded message and
/// the messages merged into it (by tag: only a `TensorProto` has such
/// fields): every occurrence of a field, packed or not, pushes onto the
/// same `Vec`.
#[derive(Default)]
struct Numbers {
    /// By tag: the element's size in memory and the elements pushed.
    fields: [(u64, u64); 18],
}

impl Numbers {
    fn add(&mut self, tag: u64, size: u64, elements: u64) {
        if let Some((each, count)) = usize::try_from(tag).ok().and_then(|tag| self.fields.get_mut(tag)) {
            *each = size;
            *count = count.saturating_add(elements);
        }
    }

    /// What the `Vec`s hold at the end; `once_more` keeps the largest block
    /// a `Vec` held before its last growth (live beside the new one while
    /// it moves).
    fn cost(&self, once_more: &mut u64) -> u64 {
        let mut cost = 0u64;
        for &(size, count) in &self.fields {
            let capacity = vec_capacity(count, size);
            cost = cost.saturating_add(capacity.saturating_mul(size));
            if capacity > vec_capacity(1, size) {
                *once_more = (*once_more).max((capacity / 2).saturating_mul(size));
            }
        }
        cost
    }
}

/// The capacity of a `Vec` of `size`-byte elements after `elements` pushes
/// one at a time, as std grows one: none, then 8 slots for bytes and 4 for
/// larger elements, doubled whenever full. A unit test holds it to std's.
fn vec_capacity(elements: u64, size: u64) -> u64 {
    let first = if size == 1 { 8 } else { 4 };
    match elements {
        0 => 0,
        n => n.checked_next_power_of_two().unwrap_or(u64::MAX).max(first),
    }
}

/// The cost of what `message` (its fields in `wire`) holds, but for its
/// repeated numbers: those are counted into `numbers`, the `Vec`s of the
/// decoded message they are pushed onto. `once_more` keeps the largest
/// temporary (a bytes field's buffer, a `Vec`'s block while it moves).
fn walk(message: Message, mut wire: &[u8], once_more: &mut u64, numbers: &mut Numbers) -> u64 {
    let mut cost = 0u64;
    while !wire.is_empty() {
        let Some(key) = varint(&mut wire) else { break };
        let (tag, field) = (key >> 3, field(message, key >> 3));
        // A number not packed: one element pushed.
        let mut one_number = || {
            if let Some(Field::Numbers { size, .. }) = field {
                numbers.add(tag, size, 1);
            }
            0
        };
        let kept = match key & 7 {
            0 if varint(&mut wire).is_some() => one_number(),
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                let Some(rest) = wire.get(width..) else { break };
                wire = rest;
                one_number()
            }
            2 => {
                let Some(len) = varint(&mut wire) else { break };
                let Some(body) = usize::try_from(len).ok().and_then(|len| wire.get(..len)) else { break };
                wire = &wire[body.len()..];
                match field {
                    None => 0,
                    Some(Field::Inline(inner)) => walk(inner, body, once_more, numbers),
                    Some(Field::Element(inner, each)) => {
                        // A message of its own: its numbers fill its own Vecs.
                        let mut own = Numbers::default();
                        let held = walk(inner, body, once_more, &mut own);
                        each.saturating_add(held).saturating_add(own.cost(once_more))
                    }
                    Some(Field::Bytes) => {
                        *once_more = (*once_more).max(len);
                        len
                    }
                    Some(Field::BytesElement) => {
                        *once_more = (*once_more).max(len);
                        (VEC_SLOTS * size_of::<Vec<u8>>() as u64).saturating_add(len)
                    }
                    Some(Field::Numbers { size, fixed }) => {
                        // Packed: a varint ends at each byte with the high bit clear (prost stops at a broken one).
                        let elements = match fixed {
                            Some(width) => len.div_ceil(width),
                            None => body.iter().filter(|&&byte| byte & 0x80 == 0).count() as u64,
                        };
                        numbers.add(tag, size, elements);
                        0
                    }
                }
            }
            3 if skip_group(&mut wire) => 0,
            // A broken varint, an end of group where none began, wire types 6 and 7: prost stops.
            _ => break,
        };
        cost = cost.saturating_add(kept);
    }
    cost
}

/// Moves past a group (deprecated, never in TF Serving's messages; prost
/// skips one in an unknown field, nothing kept); `false` where it does not end.
fn skip_group(wire: &mut &[u8]) -> bool {
    // prost's own limit on nesting.
    const MAX_DEPTH: u32 = 100;
    let mut depth = 1u32;
    while depth > 0 {
        let Some(key) = varint(wire) else { return false };
        let skipped = match key & 7 {
            0 => varint(wire).is_some(),
            1 => wire.get(8..).map(|rest| *wire = rest).is_some(),
            5 => wire.get(4..).map(|rest| *wire = rest).is_some(),
            2 => varint(wire)
                .and_then(|len| usize::try_from(len).ok())
                .and_then(|len| wire.get(len..))
                .map(|rest| *wire = rest)
                .is_some(),
            3 => {
                depth += 1;
                depth <= MAX_DEPTH
            }
            4 => {
                depth -= 1;
                true
            }
            _ => false,
        };
        if !skipped {
            return false;
        }
    }
    true
}

/// A base-128 varint of at most 10 bytes, as prost reads one.
fn varint(wire: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in wire.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *wire = &wire[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::proto::*;
    use super::*;
    use prost::Message as _;

    fn predict(inputs: Vec<(String, TensorProto)>) -> Vec<u8> {
        PredictionLog {
            log_type: Some(prediction_log::LogType::PredictLog(PredictLog {
                request: Some(PredictRequest { model_spec: None, inputs: inputs.into_iter().collect() }),
            })),
        }
        .encode_to_vec()
    }

    #[test]
    fn the_cost_is_at_least_what_the_decoded_message_holds() {
        let tensor = TensorProto {
            dtype: 1,
            tensor_shape: Some(TensorShapeProto { dim: vec![Dim { size: 3 }; 2], unknown_rank: false }),
            tensor_content: vec![7; 1000],
            float_val: vec![1.0; 10],
            int64_val: vec![1; 10],
            string_val: vec![b"abc".to_vec(); 5],
            ..TensorProto::default()
        };
        let record = predict(vec![("x".into(), tensor.clone()), ("y".into(), tensor)]);
        let cost = decode_cost(&record);
        // Two tensor_contents, the longest once more, and the elements.
        assert!(cost >= 3000 + 2 * (40 + 80 + 5 * 24), "{cost}");
        assert!(cost < 3000 + 2 * (MAP_SLOTS * 400) + 4096, "{cost}");
    }

    #[test]
    fn empty_elements_are_not_free() {
        // A million empty examples: 2 MB on the wire, 24 MB of Vecs at least.
        let list = PredictionLog {
            log_type: Some(prediction_log::LogType::ClassifyLog(ClassifyLog {
                request: Some(ExamplesRequest {
                    model_spec: None,
                    input: Some(Input {
                        kind: Some(input::Kind::ExampleList(ExampleList { examples: vec![Vec::new(); 1_000_000] })),
                    }),
                }),
            })),
        }
        .encode_to_vec();
        assert_eq!(decode_cost(&list), 1_000_000 * VEC_SLOTS * 24);
        // Distinct input names, each a default TensorProto.
        let entries: Vec<(String, TensorProto)> = (0..1000).map(|i| (format!("{i}"), TensorProto::default())).collect();
        let cost = decode_cost(&predict(entries));
        assert!(cost >= 1000 * MAP_SLOTS * size_of::<(String, TensorProto)>() as u64, "{cost}");
        // Packed varints: one byte each on the wire, 8 in memory, in a Vec of 1024 that was 512.
        let packed = predict(vec![("x".into(), TensorProto { int64_val: vec![0; 1000], ..TensorProto::default() })]);
        assert!(decode_cost(&packed) >= (1024 + 512) * 8);
    }

    #[test]
    fn unknown_fields_and_groups_cost_nothing_and_broken_wire_stops_the_walk() {
        // Field 9 of a PredictionLog (unknown): a group holding a nested group, then a varint.
        let unknown = [0x4b, 0x53, 0x08, 0x01, 0x54, 0x4c, 0x48, 0x05];
        assert_eq!(decode_cost(&unknown), 0);
        // A length past the end, a varint that never ends, an end-group with no group.
        assert_eq!(decode_cost(&[0x32, 0x7f, 0x00]), 0);
        assert_eq!(decode_cost(&[0xff; 20]), 0);
        assert_eq!(decode_cost(&[0x4c]), 0);
    }

    #[test]
    fn repeated_numbers_are_charged_per_element_at_the_capacity_std_gives_them() {
        fn grown<T: Default>(elements: u64) -> u64 {
            let mut v = Vec::new();
            (0..elements).for_each(|_| v.push(T::default()));
            v.capacity() as u64
        }
        for elements in [0, 1, 3, 4, 5, 8, 9, 1000, 1024, 1025, 100_000] {
            assert_eq!(vec_capacity(elements, 1), grown::<bool>(elements), "{elements} bools");
            assert_eq!(vec_capacity(elements, 4), grown::<i32>(elements), "{elements} int32");
            assert_eq!(vec_capacity(elements, 8), grown::<i64>(elements), "{elements} int64");
        }
        let tensor = |int64_val: Vec<i64>| TensorProto { int64_val, ..TensorProto::default() };
        // An entry of no numbers: its name's byte is the largest temporary, once more.
        let entry = decode_cost(&predict(vec![("x".into(), tensor(Vec::new()))])) - 1;
        // 1000 values of 2 bytes each on the wire: 1000 elements, not 2000, in a Vec of 1024 that was 512.
        let ids = decode_cost(&predict(vec![("x".into(), tensor(vec![300; 1000]))]));
        assert_eq!(ids - entry, (1024 + 512) * 8);
        // Unpacked (one key each), in two chunks of one tensor merged by prost: one Vec of 5 elements.
        let mut record = predict(vec![("x".into(), tensor(Vec::new()))]);
        let unpacked = [0x50, 0x01, 0x50, 0x02, 0x50, 0x03];
        let chunk = [0x12, 0x06].iter().chain(&unpacked).copied().collect::<Vec<u8>>();
        // PredictionLog 6 { PredictLog 1 { PredictRequest 2 { entry 1: "x", 2: tensor, 2: tensor } } }.
        let inner = [&[0x0a, 0x01, b'x'][..], &chunk, &[0x12, 0x04, 0x50, 0x04, 0x50, 0x05]].concat();
        let request = [&[0x12, inner.len() as u8][..], &inner].concat();
        let log = [&[0x0a, request.len() as u8][..], &request].concat();
        record.clear();
        record.extend([0x32, log.len() as u8]);
        record.extend(&log);
        let decoded = PredictionLog::decode(record.as_slice()).unwrap();
        let Some(prediction_log::LogType::PredictLog(PredictLog { request: Some(request) })) = decoded.log_type else {
            panic!("predict log")
        };
        assert_eq!(request.inputs["x"].int64_val, [1, 2, 3, 4, 5]);
        assert_eq!(decode_cost(&record) - entry, 8 * 8 + 4 * 8);
    }
}
