//! Signatures out of `saved_model.pb` (or out of the `MetaGraphDef` that
//! `TF_LoadSessionFromSavedModel` returns), in isorun's own types.

use isorun_protocol::{tf_code_name, DType, ErrorKind, SignatureInfo, TensorSpec};
use prost::Message;
use std::path::{Path, PathBuf};

/// TensorFlow's messages, only the fields isorun reads; tags as in
/// `tensorflow/core/protobuf/{saved_model,meta_graph}.proto`.
pub mod proto {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SavedModel {
        #[prost(int64, tag = "1")]
        pub saved_model_schema_version: i64,
        #[prost(message, repeated, tag = "2")]
        pub meta_graphs: Vec<MetaGraphDef>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MetaGraphDef {
        #[prost(message, optional, tag = "1")]
        pub meta_info_def: Option<MetaInfoDef>,
        #[prost(map = "string, message", tag = "5")]
        pub signature_def: HashMap<String, SignatureDef>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MetaInfoDef {
        #[prost(string, repeated, tag = "4")]
        pub tags: Vec<String>,
        #[prost(string, tag = "5")]
        pub tensorflow_version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SignatureDef {
        #[prost(map = "string, message", tag = "1")]
        pub inputs: HashMap<String, TensorInfo>,
        #[prost(map = "string, message", tag = "2")]
        pub outputs: HashMap<String, TensorInfo>,
        #[prost(string, tag = "3")]
        pub method_name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorInfo {
        /// The graph tensor, `op_name:index` (dense tensors only).
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(int32, tag = "2")]
        pub dtype: i32,
        #[prost(message, optional, tag = "3")]
        pub tensor_shape: Option<TensorShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {
        #[prost(message, repeated, tag = "2")]
        pub dim: Vec<Dim>,
        #[prost(bool, tag = "3")]
        pub unknown_rank: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dim {
        /// -1 for an unknown size.
        #[prost(int64, tag = "1")]
        pub size: i64,
    }
}

/// Why a SavedModel's signatures could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SavedModelError {
    #[error("{path}: cannot read")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a SavedModel protobuf ({reason})")]
    Decode { path: PathBuf, reason: String },
    #[error("{path}: no meta graph with tags {tags:?} (it has {available})")]
    NoMetaGraph { path: PathBuf, tags: Vec<String>, available: String },
    #[error("signature {key}: {name} has dtype {dtype}, which isorun cannot carry")]
    UnsupportedDtype { key: String, name: String, dtype: String },
    #[error("no signature '{key}'; the model has: {available}")]
    NoSignature { key: String, available: String },
}

impl SavedModelError {
    /// The kind of model error this is on a unit's record.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SavedModelError::UnsupportedDtype { .. } => ErrorKind::UnsupportedDtype,
            SavedModelError::NoSignature { .. } => ErrorKind::SignatureNotFound,
            SavedModelError::Read { .. } | SavedModelError::Decode { .. } | SavedModelError::NoMetaGraph { .. } => {
                ErrorKind::LoadFailed
            }
        }
    }
}

/// One meta graph: its tags and signatures (sorted by key).
#[derive(Debug, Clone, PartialEq)]
pub struct MetaGraph {
    pub tags: Vec<String>,
    pub def: proto::MetaGraphDef,
}

/// Reads `DIR/saved_model.pb`.
pub fn read_saved_model(dir: &Path) -> Result<Vec<MetaGraph>, SavedModelError> {
    let path = dir.join("saved_model.pb");
    let bytes = std::fs::read(&path).map_err(|source| SavedModelError::Read { path: path.clone(), source })?;
    let items = decoded_items(&bytes, Schema::SavedModel, 0);
    let most = most_items(bytes.len() as u64);
    if items > most {
        return Err(SavedModelError::Decode {
            path,
            reason: format!(
                "its {} bytes hold {items} meta graphs, tags, signatures, names and dimensions; at most {most} are read",
                bytes.len()
            ),
        });
    }
    let model = proto::SavedModel::decode(bytes.as_slice())
        .map_err(|e| SavedModelError::Decode { path: path.clone(), reason: e.to_string() })?;
    if model.meta_graphs.is_empty() {
        return Err(SavedModelError::Decode { path, reason: "it holds no meta graph".into() });
    }
    Ok(model
        .meta_graphs
        .into_iter()
        .map(|def| MetaGraph { tags: def.meta_info_def.as_ref().map(|m| m.tags.clone()).unwrap_or_default(), def })
        .collect())
}

/// What one decoded item (a meta graph, tag, signature, name or dimension)
/// may cost in memory at most, its share of a growing vector or map and of
/// the copy [`read_saved_model`] makes included.
const ITEM_COST: u64 = 512;

/// The most items a `saved_model.pb` of `len` bytes may hold: a file of
/// empty messages (two bytes each) would otherwise cost hundreds of times
/// its size, so the supervisor keeps to max(64 MiB, 16 x its size) whatever
/// the file says. Real files hold a few hundred items in megabytes of graph.
fn most_items(len: u64) -> u64 {
    len.saturating_mul(16).max(64 << 20) / ITEM_COST
}

/// The messages of [`proto`], for counting what decoding one would make.
#[derive(Clone, Copy)]
enum Schema {
    SavedModel,
    MetaGraph,
    MetaInfo,
    SignatureEntry,
    Signature,
    InfoEntry,
    Info,
    Shape,
}

impl Schema {
    /// What the length-delimited field `tag` of this message decodes to: a
    /// message (`Some(Some(_))`), a string or leaf message (`Some(None)`),
    /// or nothing (a field isorun skips).
    fn field(self, tag: u32) -> Option<Option<Schema>> {
        use Schema::*;
        match (self, tag) {
            (SavedModel, 2) => Some(Some(MetaGraph)),
            (MetaGraph, 1) => Some(Some(MetaInfo)),
            (MetaGraph, 5) => Some(Some(SignatureEntry)),
            (MetaInfo, 4 | 5) | (SignatureEntry | InfoEntry | Info, 1) | (Signature, 3) | (Shape, 2) => Some(None),
            (SignatureEntry, 2) => Some(Some(Signature)),
            (Signature, 1 | 2) => Some(Some(InfoEntry)),
            (InfoEntry, 2) => Some(Some(Info)),
            (Info, 3) => Some(Some(Shape)),
            _ => None,
        }
    }
}

/// How many items decoding `bytes` as `schema` would make, counted from
/// the wire format without decoding: one walk, nothing allocated. Bytes
/// that are not protobuf end the count (the decoder then says what is
/// wrong).
fn decoded_items(mut bytes: &[u8], schema: Schema, depth: u32) -> u64 {
    use prost::encoding::{decode_key, decode_varint, WireType};
    let mut items = 0u64;
    // prost refuses messages nested deeper than 100.
    if depth > 100 {
        return items;
    }
    while !bytes.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut bytes) else { break };
        let skip = match wire_type {
            WireType::Varint => match decode_varint(&mut bytes) {
                Ok(_) => 0,
                Err(_) => break,
            },
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let Some(len) = decode_varint(&mut bytes).ok().and_then(|l| usize::try_from(l).ok()) else { break };
                let Some(body) = bytes.get(..len) else { break };
                if let Some(child) = schema.field(tag) {
                    items += 1;
                    if let Some(child) = child {
                        items += decoded_items(body, child, depth + 1);
                    }
                }
                len
            }
            WireType::StartGroup | WireType::EndGroup => break,
        };
        let Some(rest) = bytes.get(skip..) else { break };
        bytes = rest;
    }
    items
}

/// The signatures of a meta graph in isorun's types, sorted by key, with the
/// graph tensor name of each input and output alongside. Inputs and outputs
/// are sorted by name. TensorFlow's internal `__saved_model_init_op` is left
/// out. Fails if any signature has a dtype isorun cannot carry; to run one
/// signature, [`signature`] checks that one only.
pub fn signatures(def: &proto::MetaGraphDef) -> Result<Vec<(SignatureInfo, SignatureTensors)>, SavedModelError> {
    def.signature_keys(false).into_iter().map(|key| signature(def, key)).collect()
}

/// The signature `key` in isorun's types, as in [`signatures`]. Only its own
/// inputs and outputs are checked: a model runs the signatures isorun can
/// carry even when another of its signatures has a dtype isorun cannot
/// (a `resource` handle, say). An unknown key (or an internal one) names the
/// keys there are.
pub fn signature(def: &proto::MetaGraphDef, key: &str) -> Result<(SignatureInfo, SignatureTensors), SavedModelError> {
    let sig = def.signature_def.get(key).filter(|_| !proto::SignatureDef::is_internal(key)).ok_or_else(|| {
        let keys = def.signature_keys(false);
        SavedModelError::NoSignature {
            key: key.to_string(),
            available: if keys.is_empty() { "none".into() } else { keys.join(", ") },
        }
    })?;
    let (inputs, input_names) = specs(key, &sig.inputs)?;
    let (outputs, output_names) = specs(key, &sig.outputs)?;
    Ok((
        SignatureInfo { key: key.to_string(), inputs, outputs },
        SignatureTensors { inputs: input_names, outputs: output_names },
    ))
}

/// TensorFlow's own signature, run once at load time to initialize tables
/// and variables; not a signature users call.
const INIT_OP_SIGNATURE: &str = "__saved_model_init_op";

impl proto::MetaGraphDef {
    /// The signature keys, sorted; TensorFlow's internal signatures
    /// (`__saved_model_init_op`) only when `include_internal`.
    pub fn signature_keys(&self, include_internal: bool) -> Vec<&str> {
        let mut keys: Vec<&str> = self
            .signature_def
            .keys()
            .map(String::as_str)
            .filter(|key| include_internal || !proto::SignatureDef::is_internal(key))
            .collect();
        keys.sort_unstable();
        keys
    }
}

impl proto::SignatureDef {
    /// True for the signatures TensorFlow adds for itself (`__saved_model_init_op`).
    pub fn is_internal(key: &str) -> bool {
        key == INIT_OP_SIGNATURE
    }
}

impl proto::TensorInfo {
    /// TensorFlow's name of the dtype (`float32`, `string`, `resource`...),
    /// whether or not isorun can carry it. An unset dtype (`DT_INVALID`,
    /// as on the output of `__saved_model_init_op`) is `invalid`.
    pub fn dtype_name(&self) -> String {
        match self.dtype {
            0 => "invalid".to_string(),
            code => tf_code_name(code),
        }
    }

    /// The shape: `None` when the rank is unknown (or no shape was saved),
    /// else one entry per dimension, `None` for an unknown size.
    pub fn dims(&self) -> Option<Vec<Option<u64>>> {
        match &self.tensor_shape {
            Some(shape) if !shape.unknown_rank => Some(shape.dim.iter().map(|d| u64::try_from(d.size).ok()).collect()),
            _ => None,
        }
    }
}

/// Graph tensor names (`op:index`) of a signature's inputs and outputs, in
/// the same order as its `SignatureInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureTensors {
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

type Specs = (Vec<TensorSpec>, Vec<String>);

fn specs(key: &str, map: &std::collections::HashMap<String, proto::TensorInfo>) -> Result<Specs, SavedModelError> {
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    let mut specs = Vec::with_capacity(names.len());
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let info = &map[name];
        let dtype = DType::from_tf_code(info.dtype).ok_or_else(|| SavedModelError::UnsupportedDtype {
            key: key.to_string(),
            name: name.clone(),
            dtype: tf_code_name(info.dtype),
        })?;
        let shape = match &info.tensor_shape {
            Some(shape) if !shape.unknown_rank => Some(shape.dim.iter().map(|d| u64::try_from(d.size).ok()).collect()),
            _ => None,
        };
        specs.push(TensorSpec { name: name.clone(), dtype, shape });
        tensors.push(info.name.clone());
    }
    Ok((specs, tensors))
}

/// Decodes a serialized `MetaGraphDef` (as `TF_LoadSessionFromSavedModel` returns it).
pub fn decode_meta_graph(bytes: &[u8]) -> Result<proto::MetaGraphDef, String> {
    proto::MetaGraphDef::decode(bytes).map_err(|e| e.to_string())
}

/// Picks the meta graph whose tag set equals `tags` (order ignored).
pub fn find_meta_graph<'a>(
    graphs: &'a [MetaGraph],
    tags: &[String],
    path: &Path,
) -> Result<&'a MetaGraph, SavedModelError> {
    // Tags are a set, as TensorFlow treats them: order and repeats do not matter.
    fn as_set(tags: &[String]) -> std::collections::BTreeSet<&str> {
        tags.iter().map(String::as_str).collect()
    }
    let wanted = as_set(tags);
    graphs.iter().find(|g| as_set(&g.tags) == wanted).ok_or_else(|| SavedModelError::NoMetaGraph {
        path: path.to_path_buf(),
        tags: tags.to_vec(),
        available: graphs.iter().map(|g| format!("{:?}", g.tags)).collect::<Vec<_>>().join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::*;

    fn info(name: &str, dtype: i32, dims: &[i64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype,
            tensor_shape: Some(TensorShapeProto {
                dim: dims.iter().map(|&size| Dim { size }).collect(),
                unknown_rank: false,
            }),
        }
    }

    #[test]
    fn signatures_come_out_sorted_with_unknown_dims() {
        let mut def = MetaGraphDef::default();
        let mut sig = SignatureDef::default();
        sig.inputs.insert("b".into(), info("serving_default_b:0", 9, &[-1]));
        sig.inputs.insert("a".into(), info("serving_default_a:0", 1, &[-1, 3]));
        sig.outputs.insert("y".into(), info("StatefulPartitionedCall:1", 7, &[]));
        def.signature_def.insert("serving_default".into(), sig);
        def.signature_def.insert("__saved_model_init_op".into(), SignatureDef::default());
        let encoded = SavedModel { saved_model_schema_version: 1, meta_graphs: vec![def] }.encode_to_vec();
        let decoded = SavedModel::decode(encoded.as_slice()).unwrap();
        let sigs = signatures(&decoded.meta_graphs[0]).unwrap();
        assert_eq!(sigs.len(), 1);
        let (info, tensors) = &sigs[0];
        assert_eq!(info.key, "serving_default");
        assert_eq!(info.inputs[0].name, "a");
        assert_eq!(info.inputs[0].dtype, DType::Float32);
        assert_eq!(info.inputs[0].shape, Some(vec![None, Some(3)]));
        assert_eq!(info.inputs[1].dtype, DType::Int64);
        assert_eq!(info.outputs[0].shape, Some(vec![]));
        assert_eq!(tensors.inputs, ["serving_default_a:0", "serving_default_b:0"]);
        assert_eq!(tensors.outputs, ["StatefulPartitionedCall:1"]);
    }

    #[test]
    fn unsupported_dtype_names_the_tensor() {
        let mut def = MetaGraphDef::default();
        let mut sig = SignatureDef::default();
        sig.inputs.insert("handle".into(), info("h:0", 20, &[]));
        def.signature_def.insert("s".into(), sig);
        let err = signatures(&def).unwrap_err().to_string();
        assert_eq!(err, "signature s: handle has dtype resource, which isorun cannot carry");
    }

    #[test]
    fn one_signature_is_checked_alone() {
        let mut def = MetaGraphDef::default();
        let mut handle = SignatureDef::default();
        handle.outputs.insert("h".into(), info("h:0", 20, &[]));
        def.signature_def.insert("handle".into(), handle);
        let mut add = SignatureDef::default();
        add.inputs.insert("x".into(), info("x:0", 1, &[-1]));
        add.outputs.insert("y".into(), info("y:0", 1, &[-1]));
        def.signature_def.insert("add".into(), add);
        def.signature_def.insert("__saved_model_init_op".into(), SignatureDef::default());

        let (add, tensors) = signature(&def, "add").unwrap();
        assert_eq!(
            (add.key.as_str(), add.inputs[0].dtype, tensors.outputs[0].as_str()),
            ("add", DType::Float32, "y:0")
        );
        let err = signature(&def, "handle").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnsupportedDtype);
        assert_eq!(err.to_string(), "signature handle: h has dtype resource, which isorun cannot carry");
        for missing in ["nope", "__saved_model_init_op"] {
            let err = signature(&def, missing).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::SignatureNotFound);
            assert_eq!(err.to_string(), format!("no signature '{missing}'; the model has: add, handle"));
        }
        let empty = MetaGraphDef::default();
        assert_eq!(signature(&empty, "x").unwrap_err().to_string(), "no signature 'x'; the model has: none");
    }

    #[test]
    fn reference_dtypes_are_read_as_their_base_dtype() {
        // A TF1 counter: `VariableV2` outputs are DT_FLOAT_REF (101).
        let mut def = MetaGraphDef::default();
        let mut get = SignatureDef::default();
        get.outputs.insert("output".into(), info("counter:0", 101, &[]));
        def.signature_def.insert("get_counter".into(), get);
        let (get, tensors) = signature(&def, "get_counter").unwrap();
        assert_eq!(get.outputs[0].dtype, DType::Float32);
        assert_eq!(get.outputs[0].shape, Some(vec![]));
        assert_eq!(tensors.outputs, ["counter:0"]);
        assert_eq!(info("counter:0", 101, &[]).dtype_name(), "float32_ref");
    }

    #[test]
    fn signature_keys_leave_out_internal_ones_unless_asked() {
        let mut def = MetaGraphDef::default();
        for key in ["serving_default", "__saved_model_init_op", "add"] {
            def.signature_def.insert(key.into(), SignatureDef::default());
        }
        assert_eq!(def.signature_keys(false), ["add", "serving_default"]);
        assert_eq!(def.signature_keys(true), ["__saved_model_init_op", "add", "serving_default"]);
    }

    #[test]
    fn tensor_info_names_any_dtype_and_unknown_shapes() {
        assert_eq!(info("x:0", 1, &[-1, 8]).dtype_name(), "float32");
        assert_eq!(info("h:0", 20, &[]).dtype_name(), "resource");
        assert_eq!(info("NoOp", 0, &[]).dtype_name(), "invalid");
        assert_eq!(info("x:0", 1, &[-1, 8]).dims(), Some(vec![None, Some(8)]));
        assert_eq!(info("x:0", 1, &[]).dims(), Some(vec![]));
        let unknown_rank = TensorInfo {
            tensor_shape: Some(TensorShapeProto { dim: vec![], unknown_rank: true }),
            ..info("x:0", 1, &[])
        };
        assert_eq!(unknown_rank.dims(), None);
        assert_eq!(TensorInfo { tensor_shape: None, ..info("x:0", 1, &[]) }.dims(), None);
    }

    #[test]
    fn garbage_is_not_a_saved_model() {
        let dir = std::env::temp_dir().join(format!("isorun-tfproto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("saved_model.pb"), b"\xff\xff\xff\xff not a protobuf").unwrap();
        let err = read_saved_model(&dir).unwrap_err();
        assert!(matches!(err, SavedModelError::Decode { .. }), "{err}");
        std::fs::write(dir.join("saved_model.pb"), b"").unwrap();
        assert!(read_saved_model(&dir).unwrap_err().to_string().contains("no meta graph"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
