//! A protobuf wire-format walker for the few `ModelProto` fields isorun
//! reads (tags as in `onnx/onnx.proto3`). It exists because decoding the
//! whole message would hold every initializer's bytes: this reads the file
//! through a small buffer, seeks past what it does not keep (`raw_data`,
//! node contents), never sizes a buffer from a claimed length beyond the
//! bytes its enclosing message has left, and charges what it keeps to a
//! budget proportional to the file.

use crate::model::{Dim, ElemType, ExternalFile, OnnxModel, Opset, ValueInfo, ValueType};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufReader, Read, Seek};
use std::path::{Component, Path, PathBuf};

/// Types (`sequence<sequence<...>>`) and graphs inside node attributes
/// (`If`, `Loop`) nest at most this deep.
pub const MAX_NESTING: usize = 32;

/// What the reader keeps may cost this much, whatever the file's size...
const BUDGET_FLOOR: u64 = 16 << 20;
/// ...or this many times the file's bytes, where that is more. With
/// vectors' and sets' doubling, live memory stays under twice the charge:
/// inside the allocation bound (max(64 MiB, 16 x the bytes)).
const BUDGET_FACTOR: u64 = 4;

/// Why an ONNX model could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("{path}: cannot read")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{path}: cannot read (at byte {offset})")]
    Read { path: PathBuf, offset: u64, source: std::io::Error },
    #[error("{0}: not a file (an ONNX model is one .onnx file)")]
    NotAFile(PathBuf),
    #[error("{0}: empty file, not an ONNX model")]
    Empty(PathBuf),
    #[error(
        "{path}: cut short or not an ONNX model: {field} at byte {offset} claims {claimed} bytes, but {left} are left"
    )]
    Truncated { path: PathBuf, field: String, offset: u64, claimed: u64, left: u64 },
    #[error("{path}: not an ONNX model: {field} at byte {offset}: {problem}")]
    Malformed { path: PathBuf, field: String, offset: u64, problem: String },
    #[error("{path}: not an ONNX model: no {field}")]
    Missing { path: PathBuf, field: &'static str },
    #[error(
        "{path}: its {bytes} bytes describe more names, types and dimensions than isorun reads of them \
         (at most {most} bytes' worth); refused at byte {offset}"
    )]
    TooLarge { path: PathBuf, bytes: u64, most: u64, offset: u64 },
    #[error(
        "{path}: tensor '{}' keeps its data at '{}', which is not a file beside the model \
         (external data is a relative path without '..')",
        tensor.escape_debug(),
        location.escape_debug()
    )]
    ExternalOutside { path: PathBuf, tensor: String, location: String },
}

/// Reads the ONNX model in the file `path`.
pub fn read_model(path: &Path) -> Result<OnnxModel, OnnxError> {
    let read = |source| OnnxError::Open { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(OnnxError::NotAFile(path.to_path_buf()));
    }
    parse_model(file, meta.len(), path)
}

/// Reads an ONNX model of `len` bytes from `source` (positioned at its
/// start); `path` names it in errors and is where external data is
/// resolved from.
pub fn parse_model<R: Read + Seek>(source: R, len: u64, path: &Path) -> Result<OnnxModel, OnnxError> {
    if len == 0 {
        return Err(OnnxError::Empty(path.to_path_buf()));
    }
    let mut walker = Walker {
        source: BufReader::with_capacity(64 << 10, source),
        pos: 0,
        len,
        path,
        kept: 0,
        budget: len.saturating_mul(BUDGET_FACTOR).max(BUDGET_FLOOR),
    };
    walker.model()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

/// What the graphs of a model hold that the model's view needs.
#[derive(Default)]
struct Parts {
    /// Names of the main graph's initializers.
    initializers: HashSet<String>,
    inputs: Vec<ValueInfo>,
    outputs: Vec<ValueInfo>,
    graph_name: String,
    /// External-data location: tensors in it.
    external: BTreeMap<String, usize>,
}

struct Walker<'p, R> {
    source: BufReader<R>,
    /// Bytes consumed from the start of the file.
    pos: u64,
    len: u64,
    path: &'p Path,
    /// Bytes of what is kept, as charged.
    kept: u64,
    budget: u64,
}

impl<R: Read + Seek> Walker<'_, R> {
    fn model(&mut self) -> Result<OnnxModel, OnnxError> {
        let end = self.len;
        let mut model = OnnxModel { path: self.path.to_path_buf(), ..OnnxModel::default() };
        let mut parts = Parts::default();
        let (mut ir_version, mut graph) = (false, false);
        while let Some((tag, wire)) = self.key(end, "ModelProto")? {
            match tag {
                1 => {
                    model.ir_version = self.int(wire, end, "ir_version")? as i64;
                    ir_version = true;
                }
                2 => model.producer_name = self.string(wire, end, "producer_name")?,
                3 => model.producer_version = self.string(wire, end, "producer_version")?,
                7 => {
                    let body = self.body(wire, end, "graph")?;
                    self.graph(body, &mut parts, 0)?;
                    graph = true;
                }
                8 => {
                    let body = self.body(wire, end, "opset_import")?;
                    let opset = self.opset(body)?;
                    model.opsets.push(opset);
                }
                // Model-local functions: ONNX Runtime inlines their nodes, so a
                // Constant in one loads its external data as an initializer would.
                25 => {
                    let body = self.body(wire, end, "functions")?;
                    self.function(body, &mut parts)?;
                }
                // Training graphs (initialization, algorithm): not run for
                // inference, but their tensors' locations are checked all the same.
                20 => {
                    let body = self.body(wire, end, "training_info")?;
                    while let Some((tag, wire)) = self.key(body, "training_info")? {
                        match tag {
                            1 | 2 => {
                                let graph = self.body(wire, body, "training_info.graph")?;
                                self.graph(graph, &mut parts, 1)?;
                            }
                            _ => self.skip(wire, body, "training_info")?,
                        }
                    }
                }
                _ => self.skip(wire, end, "ModelProto")?,
            }
        }
        if !ir_version {
            return Err(OnnxError::Missing { path: self.path.to_path_buf(), field: "ir_version (ModelProto field 1)" });
        }
        if !graph {
            return Err(OnnxError::Missing { path: self.path.to_path_buf(), field: "graph (ModelProto field 7)" });
        }
        let listed = parts.inputs.len();
        model.inputs = parts.inputs.into_iter().filter(|input| !parts.initializers.contains(&input.name)).collect();
        model.initializer_inputs = listed - model.inputs.len();
        model.outputs = parts.outputs;
        model.graph_name = parts.graph_name;
        let folder = model.folder().to_path_buf();
        model.external_data = parts
            .external
            .into_iter()
            .map(|(location, tensors)| ExternalFile { path: folder.join(&location), location, tensors })
            .collect();
        Ok(model)
    }

    fn opset(&mut self, end: u64) -> Result<Opset, OnnxError> {
        self.keep(std::mem::size_of::<Opset>() as u64)?;
        let mut opset = Opset { domain: String::new(), version: 0 };
        while let Some((tag, wire)) = self.key(end, "opset_import")? {
            match tag {
                1 => opset.domain = self.string(wire, end, "opset_import.domain")?,
                2 => opset.version = self.int(wire, end, "opset_import.version")? as i64,
                _ => self.skip(wire, end, "opset_import")?,
            }
        }
        Ok(opset)
    }

    /// A `GraphProto`: the main one (`depth` 0) gives its name, inputs,
    /// outputs and initializer names; every one, its external data.
    fn graph(&mut self, end: u64, parts: &mut Parts, depth: usize) -> Result<(), OnnxError> {
        let main = depth == 0;
        if depth > MAX_NESTING {
            return Err(self.malformed("graph", self.pos, format!("graphs nested more than {MAX_NESTING} deep")));
        }
        while let Some((tag, wire)) = self.key(end, "graph")? {
            match tag {
                1 => {
                    let body = self.body(wire, end, "graph.node")?;
                    self.node(body, parts, depth)?;
                }
                2 if main => parts.graph_name = self.string(wire, end, "graph.name")?,
                5 => {
                    let body = self.body(wire, end, "graph.initializer")?;
                    let name = self.tensor(body, parts, "graph.initializer")?;
                    if main {
                        self.keep(name.len() as u64 + 2 * std::mem::size_of::<String>() as u64)?;
                        parts.initializers.insert(name);
                    }
                }
                15 => {
                    let body = self.body(wire, end, "graph.sparse_initializer")?;
                    let name = self.sparse_tensor(body, parts, "graph.sparse_initializer")?;
                    if main {
                        self.keep(name.len() as u64 + 2 * std::mem::size_of::<String>() as u64)?;
                        parts.initializers.insert(name);
                    }
                }
                11 if main => {
                    let body = self.body(wire, end, "graph.input")?;
                    let input = self.value_info(body, "graph.input")?;
                    parts.inputs.push(input);
                }
                12 if main => {
                    let body = self.body(wire, end, "graph.output")?;
                    let output = self.value_info(body, "graph.output")?;
                    parts.outputs.push(output);
                }
                _ => self.skip(wire, end, "graph")?,
            }
        }
        Ok(())
    }

    /// A `FunctionProto` of the model: its nodes and its attributes'
    /// default values, looked into as a graph's nodes are.
    fn function(&mut self, end: u64, parts: &mut Parts) -> Result<(), OnnxError> {
        while let Some((tag, wire)) = self.key(end, "functions")? {
            match tag {
                7 => {
                    let body = self.body(wire, end, "functions.node")?;
                    self.node(body, parts, 1)?;
                }
                11 => {
                    let body = self.body(wire, end, "functions.attribute_proto")?;
                    self.attribute(body, parts, 1)?;
                }
                _ => self.skip(wire, end, "functions")?,
            }
        }
        Ok(())
    }

    /// A `NodeProto`: only its attributes' tensors and graphs are looked into.
    fn node(&mut self, end: u64, parts: &mut Parts, depth: usize) -> Result<(), OnnxError> {
        while let Some((tag, wire)) = self.key(end, "graph.node")? {
            if tag != 5 {
                self.skip(wire, end, "graph.node")?;
                continue;
            }
            let attribute_end = self.body(wire, end, "graph.node.attribute")?;
            self.attribute(attribute_end, parts, depth)?;
        }
        Ok(())
    }

    /// An `AttributeProto`: its tensors (each copy of a tensor given twice:
    /// protobuf merges them, so every copy's locations count) and graphs.
    fn attribute(&mut self, end: u64, parts: &mut Parts, depth: usize) -> Result<(), OnnxError> {
        while let Some((tag, wire)) = self.key(end, "graph.node.attribute")? {
            match tag {
                5 | 10 => {
                    let body = self.body(wire, end, "graph.node.attribute.t")?;
                    self.tensor(body, parts, "graph.node.attribute.t")?;
                }
                6 | 11 => {
                    let body = self.body(wire, end, "graph.node.attribute.g")?;
                    self.graph(body, parts, depth + 1)?;
                }
                22 | 23 => {
                    let body = self.body(wire, end, "graph.node.attribute.sparse_tensor")?;
                    self.sparse_tensor(body, parts, "graph.node.attribute.sparse_tensor")?;
                }
                _ => self.skip(wire, end, "graph.node.attribute")?,
            }
        }
        Ok(())
    }

    /// A `TensorProto`: its name, and every file its `external_data`
    /// names (recorded in `parts`); its data is skipped. Every `location`
    /// entry counts, whatever `data_location` says and however often it is
    /// given: ONNX Runtime reads the last one of a tensor whose copies
    /// protobuf merged, and an enum as its low 32 bits, so a file is
    /// checked and granted whenever any reading could open it.
    fn tensor(&mut self, end: u64, parts: &mut Parts, field: &str) -> Result<String, OnnxError> {
        let mut name = String::new();
        let mut locations: Vec<String> = Vec::new();
        let mut external = false;
        while let Some((tag, wire)) = self.key(end, field)? {
            match tag {
                8 => name = self.string_unkept(wire, end, field)?,
                13 => {
                    let entry_end = self.body(wire, end, field)?;
                    let (mut key, mut value) = (String::new(), String::new());
                    while let Some((tag, wire)) = self.key(entry_end, field)? {
                        match tag {
                            1 => key = self.string_unkept(wire, entry_end, field)?,
                            2 => value = self.string_unkept(wire, entry_end, field)?,
                            _ => self.skip(wire, entry_end, field)?,
                        }
                    }
                    if key == "location" && !locations.contains(&value) {
                        self.keep(value.len() as u64 + std::mem::size_of::<String>() as u64)?;
                        locations.push(value);
                    }
                }
                // An enum: protobuf's C++ reader keeps its low 32 bits.
                14 => external = self.int(wire, end, field)? as u32 == 1,
                _ => self.skip(wire, end, field)?,
            }
        }
        if external && locations.is_empty() {
            return Err(self.malformed(
                field,
                end,
                format!("tensor '{}' has data_location EXTERNAL but no 'location' entry", name.escape_debug()),
            ));
        }
        for location in locations {
            if !beside_the_model(&location) {
                return Err(OnnxError::ExternalOutside { path: self.path.to_path_buf(), tensor: name, location });
            }
            if let Some(count) = parts.external.get_mut(&location) {
                *count += 1;
            } else {
                self.keep(location.len() as u64 + 4 * std::mem::size_of::<String>() as u64)?;
                parts.external.insert(location, 1);
            }
        }
        Ok(name)
    }

    /// A `SparseTensorProto`: its name is its values' name.
    fn sparse_tensor(&mut self, end: u64, parts: &mut Parts, field: &str) -> Result<String, OnnxError> {
        let mut name = String::new();
        while let Some((tag, wire)) = self.key(end, field)? {
            match tag {
                1 => {
                    let body = self.body(wire, end, field)?;
                    name = self.tensor(body, parts, field)?;
                }
                2 => {
                    let body = self.body(wire, end, field)?;
                    self.tensor(body, parts, field)?;
                }
                _ => self.skip(wire, end, field)?,
            }
        }
        Ok(name)
    }

    fn value_info(&mut self, end: u64, field: &str) -> Result<ValueInfo, OnnxError> {
        self.keep(std::mem::size_of::<ValueInfo>() as u64)?;
        let mut info = ValueInfo { name: String::new(), value_type: ValueType::Unknown };
        while let Some((tag, wire)) = self.key(end, field)? {
            match tag {
                1 => info.name = self.string(wire, end, field)?,
                2 => {
                    let body = self.body(wire, end, field)?;
                    info.value_type = self.type_proto(body, field, 0)?;
                }
                _ => self.skip(wire, end, field)?,
            }
        }
        Ok(info)
    }

    /// A `TypeProto` (a oneof: the last one given wins, as in protobuf).
    fn type_proto(&mut self, end: u64, field: &str, depth: usize) -> Result<ValueType, OnnxError> {
        if depth > MAX_NESTING {
            return Err(self.malformed(field, self.pos, format!("types nested more than {MAX_NESTING} deep")));
        }
        let mut value_type = ValueType::Unknown;
        while let Some((tag, wire)) = self.key(end, field)? {
            match tag {
                1 | 8 => {
                    let body = self.body(wire, end, field)?;
                    let (elem, shape) = self.tensor_type(body, field)?;
                    value_type = if tag == 1 {
                        ValueType::Tensor { elem, shape }
                    } else {
                        ValueType::SparseTensor { elem, shape }
                    };
                }
                4 | 9 => {
                    let body = self.body(wire, end, field)?;
                    let mut inner = ValueType::Unknown;
                    while let Some((tag, wire)) = self.key(body, field)? {
                        if tag == 1 {
                            let inner_end = self.body(wire, body, field)?;
                            inner = self.nested_type(inner_end, field, depth)?;
                        } else {
                            self.skip(wire, body, field)?;
                        }
                    }
                    let inner = Box::new(inner);
                    value_type = if tag == 4 { ValueType::Sequence(inner) } else { ValueType::Optional(inner) };
                }
                5 => {
                    let body = self.body(wire, end, field)?;
                    let (mut key, mut value) = (ElemType(0), ValueType::Unknown);
                    while let Some((tag, wire)) = self.key(body, field)? {
                        match tag {
                            1 => key = ElemType(self.int(wire, body, field)? as i32),
                            2 => {
                                let value_end = self.body(wire, body, field)?;
                                value = self.nested_type(value_end, field, depth)?;
                            }
                            _ => self.skip(wire, body, field)?,
                        }
                    }
                    value_type = ValueType::Map { key, value: Box::new(value) };
                }
                7 => {
                    let body = self.body(wire, end, field)?;
                    let (mut domain, mut name) = (String::new(), String::new());
                    while let Some((tag, wire)) = self.key(body, field)? {
                        match tag {
                            1 => domain = self.string(wire, body, field)?,
                            2 => name = self.string(wire, body, field)?,
                            _ => self.skip(wire, body, field)?,
                        }
                    }
                    value_type = ValueType::Opaque { domain, name };
                }
                _ => self.skip(wire, end, field)?,
            }
        }
        Ok(value_type)
    }

    fn nested_type(&mut self, end: u64, field: &str, depth: usize) -> Result<ValueType, OnnxError> {
        self.keep(std::mem::size_of::<ValueType>() as u64)?;
        self.type_proto(end, field, depth + 1)
    }

    /// `TypeProto.Tensor` or `.SparseTensor`: element type and shape
    /// (`None` where no shape is given: unknown rank).
    fn tensor_type(&mut self, end: u64, field: &str) -> Result<(ElemType, Option<Vec<Dim>>), OnnxError> {
        let (mut elem, mut shape) = (ElemType(0), None);
        while let Some((tag, wire)) = self.key(end, field)? {
            match tag {
                1 => elem = ElemType(self.int(wire, end, field)? as i32),
                2 => {
                    let shape_end = self.body(wire, end, field)?;
                    let mut dims = Vec::new();
                    while let Some((tag, wire)) = self.key(shape_end, field)? {
                        if tag == 1 {
                            let dim_end = self.body(wire, shape_end, field)?;
                            self.keep(std::mem::size_of::<Dim>() as u64)?;
                            dims.push(self.dim(dim_end, field)?);
                        } else {
                            self.skip(wire, shape_end, field)?;
                        }
                    }
                    shape = Some(dims);
                }
                _ => self.skip(wire, end, field)?,
            }
        }
        Ok((elem, shape))
    }

    fn dim(&mut self, end: u64, field: &str) -> Result<Dim, OnnxError> {
        let mut dim = Dim::Unknown;
        while let Some((tag, wire)) = self.key(end, field)? {
            match tag {
                1 => {
                    let size = self.int(wire, end, field)? as i64;
                    dim = u64::try_from(size).map_or(Dim::Unknown, Dim::Fixed);
                }
                2 => dim = Dim::Symbolic(self.string(wire, end, field)?),
                _ => self.skip(wire, end, field)?,
            }
        }
        Ok(dim)
    }

    // The wire format.

    /// The next field's number and wire type, or `None` at `end`.
    fn key(&mut self, end: u64, field: &str) -> Result<Option<(u64, Wire)>, OnnxError> {
        if self.pos >= end {
            return Ok(None);
        }
        let at = self.pos;
        let key = self.varint(end, field)?;
        let wire = match key & 7 {
            0 => Wire::Varint,
            1 => Wire::Fixed64,
            2 => Wire::Len,
            5 => Wire::Fixed32,
            other => {
                return Err(self.malformed(field, at, format!("wire type {other}, which ONNX files do not use")));
            }
        };
        let tag = key >> 3;
        if tag == 0 {
            return Err(self.malformed(field, at, "field number 0".into()));
        }
        Ok(Some((tag, wire)))
    }

    fn varint(&mut self, end: u64, field: &str) -> Result<u64, OnnxError> {
        let at = self.pos;
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            if self.pos >= end {
                return Err(self.malformed(field, at, "a number runs past the end of its message".into()));
            }
            let mut byte = [0u8];
            self.read_exact(&mut byte)?;
            value |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] < 0x80 {
                return Ok(value);
            }
        }
        Err(self.malformed(field, at, "a number longer than 10 bytes".into()))
    }

    fn int(&mut self, wire: Wire, end: u64, field: &str) -> Result<u64, OnnxError> {
        self.expect(wire, Wire::Varint, field)?;
        self.varint(end, field)
    }

    /// A length-delimited field's body: returns where it ends, having
    /// checked that it ends before `end`.
    fn body(&mut self, wire: Wire, end: u64, field: &str) -> Result<u64, OnnxError> {
        self.expect(wire, Wire::Len, field)?;
        let at = self.pos;
        let claimed = self.varint(end, field)?;
        let left = end - self.pos;
        if claimed > left {
            return Err(OnnxError::Truncated {
                path: self.path.to_path_buf(),
                field: field.into(),
                offset: at,
                claimed,
                left,
            });
        }
        Ok(self.pos + claimed)
    }

    fn skip(&mut self, wire: Wire, end: u64, field: &str) -> Result<(), OnnxError> {
        let target = match wire {
            Wire::Varint => return self.varint(end, field).map(drop),
            Wire::Len => self.body(wire, end, field)?,
            Wire::Fixed64 | Wire::Fixed32 => {
                let size = if wire == Wire::Fixed64 { 8 } else { 4 };
                let left = end - self.pos;
                if size > left {
                    return Err(OnnxError::Truncated {
                        path: self.path.to_path_buf(),
                        field: field.into(),
                        offset: self.pos,
                        claimed: size,
                        left,
                    });
                }
                self.pos + size
            }
        };
        let forward = (target - self.pos) as i64;
        let at = self.pos;
        self.source.seek_relative(forward).map_err(|source| OnnxError::Read {
            path: self.path.to_path_buf(),
            offset: at,
            source,
        })?;
        self.pos = target;
        Ok(())
    }

    /// A string the model's view keeps, charged to the budget.
    fn string(&mut self, wire: Wire, end: u64, field: &str) -> Result<String, OnnxError> {
        let text = self.string_unkept(wire, end, field)?;
        self.keep(text.len() as u64 + std::mem::size_of::<String>() as u64)?;
        Ok(text)
    }

    /// A string dropped before the next one is read (a tensor's name, an
    /// external-data entry): at most the bytes its message has left.
    fn string_unkept(&mut self, wire: Wire, end: u64, field: &str) -> Result<String, OnnxError> {
        let body_end = self.body(wire, end, field)?;
        let at = self.pos;
        let size = body_end - at;
        let mut bytes = Vec::new();
        // `take` grows the buffer with the bytes that arrive, not with the claim.
        let got = (&mut self.source).take(size).read_to_end(&mut bytes).map_err(|source| OnnxError::Read {
            path: self.path.to_path_buf(),
            offset: at,
            source,
        })?;
        self.pos += got as u64;
        if (got as u64) < size {
            let source = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
            return Err(OnnxError::Read { path: self.path.to_path_buf(), offset: self.pos, source });
        }
        String::from_utf8(bytes).map_err(|e| self.malformed(field, at, format!("a string that is not UTF-8 ({e})")))
    }

    fn read_exact(&mut self, buffer: &mut [u8]) -> Result<(), OnnxError> {
        let at = self.pos;
        self.source.read_exact(buffer).map_err(|source| OnnxError::Read {
            path: self.path.to_path_buf(),
            offset: at,
            source,
        })?;
        self.pos += buffer.len() as u64;
        Ok(())
    }

    fn expect(&self, wire: Wire, wanted: Wire, field: &str) -> Result<(), OnnxError> {
        if wire == wanted {
            return Ok(());
        }
        Err(self.malformed(field, self.pos, format!("wire type {wire:?}, where {wanted:?} belongs")))
    }

    /// Charges `bytes` of kept values to the budget.
    fn keep(&mut self, bytes: u64) -> Result<(), OnnxError> {
        self.kept += bytes;
        if self.kept > self.budget {
            return Err(OnnxError::TooLarge {
                path: self.path.to_path_buf(),
                bytes: self.len,
                most: self.budget,
                offset: self.pos,
            });
        }
        Ok(())
    }

    fn malformed(&self, field: &str, offset: u64, problem: String) -> OnnxError {
        OnnxError::Malformed { path: self.path.to_path_buf(), field: field.into(), offset, problem }
    }
}

/// Whether an external-data location names a file in the model's folder
/// (or below it): relative, no `..`, no NUL.
fn beside_the_model(location: &str) -> bool {
    let path = Path::new(location);
    !location.is_empty()
        && !location.contains('\0')
        && path.is_relative()
        && path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && path.components().any(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_locations_stay_beside_the_model() {
        for good in ["weights.bin", "./weights.bin", "data/w.bin", "model.onnx.data"] {
            assert!(beside_the_model(good), "{good}");
        }
        for bad in ["", "/etc/passwd", "../secret", "data/../../x", ".", "./", "a\0b"] {
            assert!(!beside_the_model(bad), "{bad:?}");
        }
    }
}
