//! `tf.train.Example`, the record type of TFRecord datasets, as prost
//! messages written out by hand (`tensorflow/core/example/example.proto` and
//! `feature.proto`): five small messages do not justify a build script.
//! prost decodes repeated numbers both packed and unpacked, as protobuf
//! requires, so files from any writer parse.

use std::collections::HashMap;

/// An example: named features. Its `Message` is written out, not derived,
/// so that decoding first counts on the wire what the example would cost
/// ([`decoded_cost`]): a record of empty strings (two bytes each, a vector
/// of 24 each) would otherwise take 18 times its bytes.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Example {
    pub features: Option<Features>,
}

impl prost::Message for Example {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        if let Some(features) = &self.features {
            prost::encoding::message::encode(1, features, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            1 => prost::encoding::message::merge(
                wire_type,
                self.features.get_or_insert_with(Features::default),
                buf,
                ctx,
            )
            .map_err(|mut error| {
                error.push("Example", "features");
                error
            }),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        self.features.as_ref().map_or(0, |features| prost::encoding::message::encoded_len(1, features))
    }

    fn clear(&mut self) {
        self.features = None;
    }

    fn merge(&mut self, mut buf: impl prost::bytes::Buf) -> Result<(), prost::DecodeError> {
        // A record arrives whole (one slice): counted before anything is made.
        if buf.chunk().len() == buf.remaining() {
            let len = buf.remaining() as u64;
            let cost = decoded_cost(buf.chunk());
            let most = len.saturating_mul(16).max(64 << 20);
            if cost > most {
                return Err(prost::DecodeError::new(format!(
                    "a tf.Example of {len} bytes would take about {cost} bytes decoded, more than {most}"
                )));
            }
        }
        let ctx = prost::encoding::DecodeContext::default();
        while buf.has_remaining() {
            let (tag, wire_type) = prost::encoding::decode_key(&mut buf)?;
            self.merge_field(tag, wire_type, &mut buf, ctx.clone())?;
        }
        Ok(())
    }
}

/// The messages of an example, for counting what decoding one makes.
#[derive(Clone, Copy)]
enum Part {
    Example,
    Features,
    Entry,
    Feature,
    Bytes,
    Floats,
    Ints,
}

/// About what decoding `bytes` as an [`Example`] would allocate at most: a
/// feature's entry 256 bytes besides its name, a string its bytes and 48
/// (its vector, twice over for the list's growth), a float 8 and an int64 16
/// (their list grown by doubling), and half as much again for a list's last
/// move. One walk of the wire, nothing allocated; bytes that are not
/// protobuf end the count (the decoder then says what is wrong).
pub fn decoded_cost(bytes: &[u8]) -> u64 {
    let mut cost = 0u64;
    walk(bytes, Part::Example, &mut cost);
    cost.saturating_add(cost / 2)
}

fn walk(mut bytes: &[u8], part: Part, cost: &mut u64) {
    use prost::encoding::{decode_key, decode_varint, WireType};
    while !bytes.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut bytes) else { return };
        let skip = match wire_type {
            WireType::Varint => {
                if decode_varint(&mut bytes).is_err() {
                    return;
                }
                if let (Part::Ints, 1) = (part, tag) {
                    *cost = cost.saturating_add(16);
                }
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => {
                if let (Part::Floats, 1) = (part, tag) {
                    *cost = cost.saturating_add(8);
                }
                4
            }
            WireType::LengthDelimited => {
                let Some(len) = decode_varint(&mut bytes).ok().and_then(|l| usize::try_from(l).ok()) else { return };
                let Some(body) = bytes.get(..len) else { return };
                let add = |cost: &mut u64, n: u64| *cost = cost.saturating_add(n);
                match (part, tag) {
                    (Part::Example, 1) => walk(body, Part::Features, cost),
                    (Part::Features, 1) => {
                        add(cost, 256);
                        walk(body, Part::Entry, cost);
                    }
                    (Part::Entry, 1) => add(cost, len as u64),
                    (Part::Entry, 2) => walk(body, Part::Feature, cost),
                    (Part::Feature, 1) => walk(body, Part::Bytes, cost),
                    (Part::Feature, 2) => walk(body, Part::Floats, cost),
                    (Part::Feature, 3) => walk(body, Part::Ints, cost),
                    (Part::Bytes, 1) => add(cost, 48 + len as u64),
                    (Part::Floats, 1) => add(cost, 2 * len as u64),
                    (Part::Ints, 1) => add(cost, 16 * body.iter().filter(|&&b| b < 0x80).count() as u64),
                    _ => {}
                }
                len
            }
            WireType::StartGroup | WireType::EndGroup => return,
        };
        let Some(rest) = bytes.get(skip..) else { return };
        bytes = rest;
    }
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
