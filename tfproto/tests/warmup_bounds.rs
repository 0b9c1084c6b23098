//! The warm-up reader held to the bound every reader of untrusted bytes in
//! the supervisor keeps: decoding a record of a file of N bytes never has
//! more than max(64 MiB, 16 × N) allocated at once. A TF Serving warm-up
//! file lives in the model's folder, so the model's author writes it, lies
//! included. `isorun-alloc-bound`'s counting global allocator measures
//! each decode and refuses anything far past the bound, so a reader that
//! believes a lie aborts this test instead of exhausting the machine.

use isorun_alloc_bound::{measure, serial, CountingAllocator};
use isorun_tfproto::serving::proto::*;
use isorun_tfproto::serving::{decode_prediction_log, record_budget, ServingError, ServingRequest};
use prost::Message;
use std::path::Path;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// One test at a time: the counters are the process's, and another test
/// making its records would count in this one's peak.
fn one_test() -> isorun_alloc_bound::Serial {
    serial()
}

/// How the supervisor decodes a record (`runner/src/warmup.rs`): with the record's budget.
fn decode(record: &[u8]) -> Result<Vec<ServingRequest>, ServingError> {
    decode_prediction_log(record, record_budget(record.len()))
}

/// Decodes `record` (of a file holding it alone: 16 bytes of TFRecord
/// framing more) and asserts the bound on what was allocated at once;
/// gives the peak and the result's description. Only under [`one_test`].
fn assert_bounded(what: &str, record: &[u8]) -> (usize, String) {
    let file_bytes = record.len() + 16;
    let (outcome, peak) = measure(what, file_bytes as u64, || match decode(record) {
        Ok(requests) => format!("ok, {} requests", requests.len()),
        Err(e) => format!("error: {e}"),
    });
    if !what.contains("mutated") {
        eprintln!("{what}: {file_bytes} bytes, peak {} bytes ({:.1}x), {outcome}", peak.bytes, peak.amplification());
    }
    assert!(peak.within_bound(), "{peak}: {outcome}");
    (peak.bytes as usize, outcome)
}

fn floats(len: i64) -> TensorProto {
    TensorProto {
        dtype: 1,
        tensor_shape: Some(TensorShapeProto { dim: vec![Dim { size: len }], unknown_rank: false }),
        float_val: vec![1.0],
        ..TensorProto::default()
    }
}

fn predict(inputs: impl IntoIterator<Item = (String, TensorProto)>) -> Vec<u8> {
    PredictionLog {
        log_type: Some(prediction_log::LogType::PredictLog(PredictLog {
            request: Some(PredictRequest { model_spec: None, inputs: inputs.into_iter().collect() }),
        })),
    }
    .encode_to_vec()
}

fn example_list(examples: Vec<Vec<u8>>) -> Option<Input> {
    Some(Input { kind: Some(input::Kind::ExampleList(ExampleList { examples })) })
}

#[test]
fn a_hundred_inputs_each_claiming_64_mib_from_one_value_are_refused_not_made() {
    let _one = one_test();
    // The file: 3 KB, one predict request, 100 inputs of [16777216] float32 with one float_val each.
    let record = predict((0..100).map(|i| (format!("input_{i:02}"), floats(1 << 24))));
    assert!(record.len() < 4096, "{}", record.len());
    let (_, outcome) = assert_bounded("100 inputs of [16777216] float32", &record);
    assert!(outcome.starts_with("error: input 'input_00'"), "{outcome}");
    // Each one under a quarter of the budget: the record is refused where the budget runs out.
    let record = predict((0..100).map(|i| (format!("input_{i:02}"), floats(1 << 21))));
    let (_, outcome) = assert_bounded("100 inputs of [2097152] float32", &record);
    assert!(outcome.starts_with("error: input 'input_03'"), "{outcome}");
}

#[test]
fn strings_examples_tasks_and_entries_are_counted_at_what_they_cost() {
    let _one = one_test();
    // Eight million empty strings from one string_val: 24 bytes each in memory.
    let strings = TensorProto {
        dtype: 7,
        tensor_shape: Some(TensorShapeProto { dim: vec![Dim { size: 8_000_000 }], unknown_rank: false }),
        string_val: vec![Vec::new()],
        ..TensorProto::default()
    };
    let (_, outcome) = assert_bounded("[8000000] strings from one empty value", &predict([("s".into(), strings)]));
    assert!(outcome.starts_with("error: input 's'"), "{outcome}");
    // A million empty tasks, each to be given its own copy of the examples.
    let tasks = PredictionLog {
        log_type: Some(prediction_log::LogType::MultiInferenceLog(MultiInferenceLog {
            request: Some(MultiInferenceRequest {
                tasks: vec![InferenceTask::default(); 1_000_000],
                input: example_list(vec![b"e".to_vec()]),
            }),
        })),
    };
    assert_bounded("1,000,000 empty multi-inference tasks", &tasks.encode_to_vec());
    // Four million empty tf.Examples.
    let examples = PredictionLog {
        log_type: Some(prediction_log::LogType::ClassifyLog(ClassifyLog {
            request: Some(ExamplesRequest { model_spec: None, input: example_list(vec![Vec::new(); 4_000_000]) }),
        })),
    };
    assert_bounded("4,000,000 empty tf.Examples", &examples.encode_to_vec());
    // 300,000 inputs, each a distinct name and an empty TensorProto.
    let entries = predict((0..300_000).map(|i| (format!("{i:x}"), TensorProto::default())));
    assert_bounded("300,000 input names", &entries);
    // A 64 KiB context for 100,000 empty examples: 6.4 GB of copies.
    let context = PredictionLog {
        log_type: Some(prediction_log::LogType::RegressLog(RegressLog {
            request: Some(ExamplesRequest {
                model_spec: None,
                input: Some(Input {
                    kind: Some(input::Kind::ExampleListWithContext(ExampleListWithContext {
                        examples: vec![Vec::new(); 100_000],
                        context: Some(vec![0; 64 << 10]),
                    })),
                }),
            }),
        })),
    };
    assert_bounded("a 64 KiB context for 100,000 examples", &context.encode_to_vec());
    // Packed int64 of one byte each on the wire, eight in memory.
    let packed = TensorProto {
        dtype: 9,
        tensor_shape: Some(TensorShapeProto { dim: vec![Dim { size: 4_000_000 }], unknown_rank: false }),
        int64_val: vec![0; 4_000_000],
        ..TensorProto::default()
    };
    let (_, outcome) = assert_bounded("4,000,000 packed int64", &predict([("i".into(), packed)]));
    assert!(outcome.starts_with("error: decoding it may take"), "{outcome}");
    // Half as many: charged per element (a Vec of 2 Mi and its 1 Mi block while it moves) and the tensor, within budget.
    let packed = TensorProto {
        dtype: 9,
        tensor_shape: Some(TensorShapeProto { dim: vec![Dim { size: 2_000_000 }], unknown_rank: false }),
        int64_val: vec![0; 2_000_000],
        ..TensorProto::default()
    };
    let (_, outcome) = assert_bounded("2,000,000 packed int64", &predict([("i".into(), packed)]));
    assert_eq!(outcome, "ok, 1 requests");
}

#[test]
fn a_large_honest_record_still_decodes() {
    let _one = one_test();
    // 48 MiB of float32 in tensor_content: its budget grows with it.
    let tensor = TensorProto {
        dtype: 1,
        tensor_shape: Some(TensorShapeProto { dim: vec![Dim { size: 12 << 20 }], unknown_rank: false }),
        tensor_content: vec![0; 48 << 20],
        ..TensorProto::default()
    };
    let (_, outcome) = assert_bounded("48 MiB in tensor_content", &predict([("x".into(), tensor)]));
    assert_eq!(outcome, "ok, 1 requests");
}

/// `len` token ids in [0, 30000), as a text model's tokenizer makes them.
fn token_ids(len: usize) -> Vec<i64> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 30_000) as i64
        })
        .collect()
}

fn ints(dtype: i32, shape: &[i64], int_val: Vec<i32>, int64_val: Vec<i64>) -> TensorProto {
    TensorProto {
        dtype,
        tensor_shape: Some(TensorShapeProto {
            dim: shape.iter().map(|&size| Dim { size }).collect(),
            unknown_rank: false,
        }),
        int_val,
        int64_val,
        ..TensorProto::default()
    }
}

/// Decodes `record` within its budget less `cast` bytes (what casting its
/// tensors to the model's dtypes makes, which the supervisor also takes
/// from the record's budget), and within the allocation bound.
fn decodes_with_room_for_casts(what: &str, record: &[u8], cast: u64) {
    let room = record_budget(record.len()) - cast;
    let decoded = decode_prediction_log(record, room).map(|requests| requests.len());
    assert!(matches!(decoded, Ok(1)), "{what}, with {cast} bytes left for casts: {decoded:?}");
    let (_, outcome) = assert_bounded(what, record);
    assert_eq!(outcome, "ok, 1 requests", "{what}");
}

#[test]
fn an_honest_warm_up_of_token_ids_still_decodes() {
    let _one = one_test();
    let (batch, length) = (128, 4096);
    let ids = token_ids(batch * length);
    let shape = [batch as i64, length as i64];
    // int64 token ids, mostly 2- and 3-byte varints (about 1.3 MB): cast to an int32 input, 2 MiB more.
    let int64 = predict([("input_ids".into(), ints(9, &shape, Vec::new(), ids.clone()))]);
    decodes_with_room_for_casts("128 x 4096 int64 token ids", &int64, 2 << 20);
    // The same as int32 in int_val: cast to an int64 input, 4 MiB more.
    let narrow: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
    let int32 = predict([("input_ids".into(), ints(3, &shape, narrow, Vec::new()))]);
    decodes_with_room_for_casts("128 x 4096 int32 token ids", &int32, 4 << 20);
    // With an attention mask of ones and token types of zeros (1-byte varints each), all cast to int32.
    let bert = predict([
        ("input_ids".into(), ints(9, &shape, Vec::new(), ids)),
        ("attention_mask".into(), ints(9, &shape, Vec::new(), vec![1; batch * length])),
        ("token_type_ids".into(), ints(9, &shape, Vec::new(), vec![0; batch * length])),
    ]);
    decodes_with_room_for_casts("128 x 4096 token ids, mask and types", &bert, 6 << 20);
}

/// The records of a TFRecord file (framing only: the CRCs are the eval crate's to check).
fn records(file: &[u8]) -> Vec<&[u8]> {
    let mut records = Vec::new();
    let mut rest = file;
    while rest.len() >= 12 {
        let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
        records.push(&rest[12..12 + len]);
        rest = &rest[12 + len + 4..];
    }
    records
}

#[test]
fn mutated_fixture_records_stay_within_the_bound() {
    let _one = one_test();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/warmup/models");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut decoded = 0;
    for model in ["predict", "classify"] {
        let file = std::fs::read(fixtures.join(model).join("assets.extra/tf_serving_warmup_requests")).unwrap();
        for record in records(&file) {
            for round in 0..300 {
                let mut mutated = record.to_vec();
                for _ in 0..1 + round % 4 {
                    let at = random() as usize % mutated.len();
                    match random() % 3 {
                        // A byte flipped, a byte made a large varint's, a byte set to all ones.
                        0 => mutated[at] ^= 1 << (random() % 8),
                        1 => mutated.splice(at..at, [0xff, 0xff, 0xff, 0x0f]).for_each(drop),
                        _ => mutated[at] = 0xff,
                    }
                }
                let (_, outcome) = assert_bounded(&format!("{model} record mutated ({round})"), &mutated);
                decoded += usize::from(outcome.starts_with("ok"));
            }
        }
    }
    assert!(decoded > 0, "some mutations still decode");
}
