//! One JSON value of a predictions row where a scalar is expected
//! ([`Scalar`]): read by serde without building a `serde_json::Value` (a
//! list or object is skipped, not built), then taken as the number, bool
//! or string a column holds.

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// One JSON value where a scalar is expected: numbers as serde_json reads
/// them, a string, or what else it was (a list or object is skipped, not built).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Scalar {
    U(u64),
    I(i64),
    F(f64),
    Bool(bool),
    Null,
    Str(String),
    List,
    Object,
}

impl Scalar {
    /// As `serde_json::Value::as_f64`.
    pub(super) fn as_f64(&self) -> Option<f64> {
        match *self {
            Scalar::U(v) => Some(v as f64),
            Scalar::I(v) => Some(v as f64),
            Scalar::F(v) => Some(v),
            _ => None,
        }
    }

    /// As `serde_json::Value::as_i64`.
    pub(super) fn as_i64(&self) -> Option<i64> {
        match *self {
            Scalar::U(v) => i64::try_from(v).ok(),
            Scalar::I(v) => Some(v),
            _ => None,
        }
    }

    pub(super) fn as_bool(&self) -> Option<bool> {
        match *self {
            Scalar::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// As `serde_json::Value::as_u64`.
    pub(super) fn as_u64(&self) -> Option<u64> {
        match *self {
            Scalar::U(v) => Some(v),
            Scalar::I(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::U(v) => write!(f, "{v}"),
            Scalar::I(v) => write!(f, "{v}"),
            Scalar::F(v) => write!(f, "{v}"),
            Scalar::Bool(v) => write!(f, "{v}"),
            Scalar::Null => f.write_str("null"),
            Scalar::Str(v) => write!(f, "{}", Value::from(v.as_str())),
            Scalar::List => f.write_str("a list"),
            Scalar::Object => f.write_str("an object"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Scalar, D::Error> {
        struct ScalarVisitor;
        impl<'de> Visitor<'de> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::I(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::U(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::F(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
                Ok(Scalar::Str(v))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_none<E>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::List)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Object)
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}
