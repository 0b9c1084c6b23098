//! The reader on real ONNX files, written by the `onnx` package
//! (`scripts/make_onnx_fixtures.py`), and on files written to be wrong.

use isorun_onnxproto::{read_model, Dim, ElemType, OnnxError, ValueType};
use isorun_protocol::DType;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx").join(name)
}

fn described(values: &[isorun_onnxproto::ValueInfo]) -> Vec<String> {
    values.iter().map(|v| format!("{}: {}", v.name, v.value_type)).collect()
}

#[test]
fn an_mlp_gives_its_opset_producer_and_symbolic_batch() {
    let model = read_model(&fixture("mlp.onnx")).unwrap();
    assert_eq!(model.ir_version, 8);
    assert_eq!(model.producer_name, "isorun-fixtures");
    assert_eq!(model.producer_version, "1.0");
    assert_eq!(model.graph_name, "mlp");
    assert_eq!(model.opsets.len(), 1);
    assert_eq!((model.opsets[0].domain_name(), model.opsets[0].version), ("ai.onnx", 17));
    assert_eq!(described(&model.inputs), ["x: float32[batch, 4]"]);
    assert_eq!(described(&model.outputs), ["y: float32[batch, 3]"]);
    assert_eq!(model.inputs[0].value_type.tensor_elem().and_then(ElemType::dtype), Some(DType::Float32));
    assert_eq!(model.inputs[0].value_type.dims().unwrap()[0], Dim::Symbolic("batch".into()));
    assert!(model.external_data.is_empty());
    assert_eq!(model.initializer_inputs, 0);
}

#[test]
fn every_dtype_and_kind_of_dimension_is_named() {
    let model = read_model(&fixture("dtypes.onnx")).unwrap();
    assert_eq!(
        described(&model.inputs),
        [
            "half: float16[batch, 8]",
            "brain: bfloat16[2, seq]",
            "text: string[?]",
            "flag: bool[]",
            "ids: int64 (unknown rank)",
            "small: uint8[batch, 3, 3]",
        ]
    );
    assert_eq!(model.outputs.len(), 6);
    let opsets: Vec<_> = model.opsets.iter().map(|o| format!("{} {}", o.domain_name(), o.version)).collect();
    assert_eq!(opsets, ["ai.onnx 18", "ai.onnx.ml 3"]);
}

#[test]
fn sequences_of_maps_are_named_as_such() {
    let model = read_model(&fixture("sequence_map.onnx")).unwrap();
    assert_eq!(described(&model.outputs), ["label: int64[n]", "probabilities: sequence<map<int64, float32[]>>"]);
    assert!(matches!(model.outputs[1].value_type, ValueType::Sequence(_)));
    assert_eq!(model.outputs[1].value_type.tensor_elem(), None);
}

#[test]
fn initializers_listed_as_inputs_below_ir_4_are_not_inputs() {
    let model = read_model(&fixture("ir3_initializer_inputs.onnx")).unwrap();
    assert_eq!(model.ir_version, 3);
    assert_eq!(described(&model.inputs), ["x: float32[batch, 4]"]);
    assert_eq!(model.initializer_inputs, 2);
}

#[test]
fn external_data_is_found_beside_the_model() {
    let path = fixture("external/external.onnx");
    let model = read_model(&path).unwrap();
    assert_eq!(model.external_data.len(), 1);
    let file = &model.external_data[0];
    assert_eq!((file.location.as_str(), file.tensors), ("weights.bin", 1));
    assert_eq!(file.path, path.parent().unwrap().join("weights.bin"));
    assert!(model.external_data.iter().all(|f| f.path.is_file()));
}

#[test]
fn a_truncated_file_is_an_error_naming_it_the_field_and_the_offset() {
    let path = fixture("truncated.onnx");
    let error = read_model(&path).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, OnnxError::Truncated { .. }), "{message}");
    assert!(message.starts_with(&format!("{}: cut short", path.display())), "{message}");
    assert!(message.contains("graph at byte "), "{message}");
}

/// A length-delimited field `tag` holding `body`.
fn field(tag: u8, body: &[u8]) -> Vec<u8> {
    // The key is a varint too (tags past 15 take two bytes).
    let mut out = key(tag, 2);
    let mut length = body.len() as u64;
    loop {
        let byte = (length & 0x7f) as u8;
        length >>= 7;
        if length == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(body);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// An initializer (name, external data at `location`) in a model of IR 8.
fn external_model(location: &str) -> Vec<u8> {
    let entry = [field(1, b"location"), field(2, location.as_bytes())].concat();
    let tensor = [field(8, b"w"), field(13, &entry), vec![14 << 3, 1]].concat();
    let graph = field(5, &tensor);
    [vec![0x08, 8], field(7, &graph)].concat()
}

#[test]
fn external_data_outside_the_model_s_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for location in ["../secret.bin", "/etc/passwd", "data/../../x"] {
        let path = write(dir.path(), "escape.onnx", &external_model(location));
        let message = read_model(&path).unwrap_err().to_string();
        assert_eq!(
            message,
            format!(
                "{}: tensor 'w' keeps its data at '{location}', which is not a file beside the model \
                 (external data is a relative path without '..')",
                path.display()
            )
        );
    }
    let path = write(dir.path(), "inside.onnx", &external_model("data/w.bin"));
    let model = read_model(&path).unwrap();
    assert_eq!(model.external_data[0].path, dir.path().join("data/w.bin"));
    assert_eq!(model.external_data.iter().filter(|f| !f.path.is_file()).count(), 1);
}

/// A field's key: `tag` and wire type `wire`, as a varint.
fn key(tag: u8, wire: u8) -> Vec<u8> {
    let key = (u16::from(tag) << 3) | u16::from(wire);
    if key < 0x80 {
        vec![key as u8]
    } else {
        vec![(key & 0x7f) as u8 | 0x80, (key >> 7) as u8]
    }
}

/// A varint field `tag` holding `value`.
fn varint(tag: u8, mut value: u64) -> Vec<u8> {
    let mut out = key(tag, 0);
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// One `external_data` entry of a TensorProto.
fn entry(key: &str, value: &str) -> Vec<u8> {
    field(13, &[field(1, key.as_bytes()), field(2, value.as_bytes())].concat())
}

/// A Constant node whose `value` attribute holds each of `tensors` (a
/// tensor given more than once is one tensor to protobuf, its copies merged).
fn constant(tensors: &[Vec<u8>]) -> Vec<u8> {
    let attribute = [field(1, b"value"), tensors.iter().map(|t| field(5, t)).collect::<Vec<_>>().concat()].concat();
    [field(4, b"Constant"), field(5, &attribute)].concat()
}

/// A model of IR 8 whose graph holds `graph`, then `rest` (other ModelProto fields).
fn model_of(graph: &[u8], rest: &[u8]) -> Vec<u8> {
    [vec![0x08, 8], field(7, graph), rest.to_vec()].concat()
}

/// Whatever way a file hides a location from one reading of it, each
/// location any reading could open is checked: a tensor given twice (the
/// second copy naming a file outside, no data_location: protobuf merges
/// the copies and ONNX Runtime reads the last location), a data_location
/// of 2^32 + 1 (EXTERNAL to a 32-bit enum), a Constant inside a model-local
/// function (ONNX Runtime inlines it) or a training graph; a location with
/// no data_location beside the model is listed, so it is granted and keyed.
#[test]
fn every_location_a_reading_could_open_is_checked_however_the_file_hides_it() {
    let dir = tempfile::tempdir().unwrap();
    let outside = |bytes: Vec<u8>, name: &str| {
        let path = write(dir.path(), name, &bytes);
        match read_model(&path) {
            Err(OnnxError::ExternalOutside { location, .. }) => location,
            other => panic!("{name}: {other:?}"),
        }
    };
    let inside = [field(8, b"c"), entry("location", "w.bin"), varint(14, 1)].concat();
    let secret = [field(8, b"c"), entry("location", "/etc/passwd")].concat();
    let merged = model_of(&field(1, &constant(&[inside.clone(), secret.clone()])), &[]);
    assert_eq!(outside(merged, "merged.onnx"), "/etc/passwd");
    let wide = [field(8, b"c"), entry("location", "../secret.bin"), varint(14, (1 << 32) + 1)].concat();
    assert_eq!(outside(model_of(&field(1, &constant(&[wide])), &[]), "wide.onnx"), "../secret.bin");
    let no_location = [field(8, b"c"), varint(14, (1 << 32) + 1)].concat();
    let path = write(dir.path(), "no_location.onnx", &model_of(&field(1, &constant(&[no_location])), &[]));
    let message = read_model(&path).unwrap_err().to_string();
    assert!(message.contains("tensor 'c' has data_location EXTERNAL but no 'location' entry"), "{message}");
    let function = field(25, &[field(1, b"f"), field(7, &constant(std::slice::from_ref(&secret)))].concat());
    assert_eq!(outside(model_of(&[], &function), "function.onnx"), "/etc/passwd");
    let training = field(20, &field(1, &field(5, &secret)));
    assert_eq!(outside(model_of(&[], &training), "training.onnx"), "/etc/passwd");
    let plain = [field(8, b"c"), entry("location", "w.bin")].concat();
    let path = write(dir.path(), "plain.onnx", &model_of(&field(1, &constant(&[plain])), &[]));
    let model = read_model(&path).unwrap();
    assert_eq!(model.external_data.len(), 1);
    assert_eq!(
        (model.external_data[0].location.as_str(), model.external_data[0].path.clone()),
        ("w.bin", dir.path().join("w.bin"))
    );
}

#[test]
fn inline_weights_are_skipped_not_read() {
    // 8 MiB of raw_data in an initializer, in a file whose reader keeps a few bytes.
    let dir = tempfile::tempdir().unwrap();
    let tensor = [field(8, b"w"), field(9, &vec![0u8; 8 << 20])].concat();
    let input = field(11, &[field(1, b"x"), field(2, &field(1, &[0x08, 1]))].concat());
    let graph = [field(5, &tensor), input].concat();
    let path = write(dir.path(), "big.onnx", &[vec![0x08, 8], field(7, &graph)].concat());
    let model = read_model(&path).unwrap();
    assert_eq!(described(&model.inputs), ["x: float32 (unknown rank)"]);
}

#[test]
fn files_that_are_not_onnx_say_what_is_wrong_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 5] = [
        ("empty.onnx", b"", "empty file, not an ONNX model"),
        ("nograph.onnx", &[0x08, 8], "not an ONNX model: no graph (ModelProto field 7)"),
        ("noir.onnx", &[0x3a, 0], "not an ONNX model: no ir_version (ModelProto field 1)"),
        ("group.onnx", &[0x0b], "not an ONNX model: ModelProto at byte 0: wire type 3, which ONNX files do not use"),
        (
            "lying.onnx",
            &[0x08, 8, 0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0],
            "cut short or not an ONNX model: graph at byte 3 claims 4294967295 bytes, but 1 are left",
        ),
    ];
    for (name, bytes, said) in cases {
        let path = write(dir.path(), name, bytes);
        let message = read_model(&path).unwrap_err().to_string();
        assert_eq!(message, format!("{}: {said}", path.display()));
    }
    let message = read_model(dir.path()).unwrap_err().to_string();
    assert!(message.ends_with("not a file (an ONNX model is one .onnx file)"), "{message}");
    let missing = dir.path().join("missing.onnx");
    assert_eq!(read_model(&missing).unwrap_err().to_string(), format!("{}: cannot read", missing.display()));
}

#[test]
fn types_nested_past_the_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut value_type = field(1, &[0x08, 1]);
    for _ in 0..100 {
        value_type = field(4, &field(1, &value_type));
    }
    let output = field(12, &[field(1, b"y"), field(2, &value_type)].concat());
    let path = write(dir.path(), "deep.onnx", &[vec![0x08, 8], field(7, &output)].concat());
    let message = read_model(&path).unwrap_err().to_string();
    assert!(message.contains("types nested more than 32 deep"), "{message}");
}

#[test]
fn the_graph_is_a_signature_with_unknown_dims_as_none_and_outputs_sorted() {
    let info = read_model(&fixture("dtypes.onnx")).unwrap().signature().unwrap();
    let inputs: Vec<String> = info.inputs.iter().map(|s| s.describe()).collect();
    assert_eq!(
        inputs,
        [
            "half (float16, [?, 8])",
            "brain (bfloat16, [2, ?])",
            "text (string, [?])",
            "flag (bool, [])",
            "ids (int64, <unknown rank>)",
            "small (uint8, [?, 3, 3])",
        ]
    );
    let names: Vec<&str> = info.outputs.iter().map(|s| s.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "outputs in name order, as workers answer");
    assert_eq!(info.outputs.len(), 6);
}

#[test]
fn a_zipmap_output_is_unsupported_dtype_naming_it_and_the_fix() {
    let error = read_model(&fixture("sequence_map.onnx")).unwrap().signature().unwrap_err();
    assert_eq!(error.kind, isorun_protocol::ErrorKind::UnsupportedDtype);
    assert!(error.message.contains("sequence_map.onnx"), "{}", error.message);
    assert!(error.message.contains("output 'probabilities' is sequence<map<int64, float32[]>>"), "{}", error.message);
    assert!(error.message.contains("zipmap"), "{}", error.message);
}
