//! `tf.train.Example`, the record type of TFRecord datasets, as prost
//! messages written out by hand (`tensorflow/core/example/example.proto` and
//! `feature.proto`): five small messages do not justify a build script.
//! prost decodes repeated numbers both packed and unpacked, as protobuf
//! requires, so files from any writer parse.

use std::collections::HashMap;

/// An example: named features.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Example {
    #[prost(message, optional, tag = "1")]
    pub features: Option<Features>,
}

/// The feature map of an example.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Features {
    #[prost(map = "string, message", tag = "1")]
    pub feature: HashMap<String, Feature>,
}

/// One feature: a list of bytes, floats or int64s.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Feature {
    #[prost(oneof = "Kind", tags = "1, 2, 3")]
    pub kind: Option<Kind>,
}

/// The three kinds of feature lists.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    #[prost(message, tag = "1")]
    BytesList(BytesList),
    #[prost(message, tag = "2")]
    FloatList(FloatList),
    #[prost(message, tag = "3")]
    Int64List(Int64List),
}

/// `bytes_list`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BytesList {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub value: Vec<Vec<u8>>,
}

/// `float_list`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FloatList {
    #[prost(float, repeated, tag = "1")]
    pub value: Vec<f32>,
}

/// `int64_list`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Int64List {
    #[prost(int64, repeated, tag = "1")]
    pub value: Vec<i64>,
}

impl Feature {
    /// A `float_list` feature.
    pub fn floats(values: Vec<f32>) -> Feature {
        Feature { kind: Some(Kind::FloatList(FloatList { value: values })) }
    }

    /// An `int64_list` feature.
    pub fn ints(values: Vec<i64>) -> Feature {
        Feature { kind: Some(Kind::Int64List(Int64List { value: values })) }
    }

    /// A `bytes_list` feature.
    pub fn bytes(values: Vec<Vec<u8>>) -> Feature {
        Feature { kind: Some(Kind::BytesList(BytesList { value: values })) }
    }

    /// `float_list`, `int64_list`, `bytes_list` or `empty`, as messages name the kind.
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            Some(Kind::BytesList(_)) => "bytes_list",
            Some(Kind::FloatList(_)) => "float_list",
            Some(Kind::Int64List(_)) => "int64_list",
            None => "empty",
        }
    }

    /// How many values the list holds.
    pub fn len(&self) -> usize {
        match &self.kind {
            Some(Kind::BytesList(l)) => l.value.len(),
            Some(Kind::FloatList(l)) => l.value.len(),
            Some(Kind::Int64List(l)) => l.value.len(),
            None => 0,
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Example {
    /// An example of the given features.
    pub fn new(features: impl IntoIterator<Item = (String, Feature)>) -> Example {
        Example { features: Some(Features { feature: features.into_iter().collect() }) }
    }

    /// The feature of that name.
    pub fn get(&self, key: &str) -> Option<&Feature> {
        self.features.as_ref()?.feature.get(key)
    }
}
