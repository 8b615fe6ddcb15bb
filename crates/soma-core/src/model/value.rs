//! `Value`: what flows along edges.
//!
//! Every variant clones in O(1) — scalars by copy, everything else by `Arc` — because the
//! executor hands the same value to every reader (a clone per reader, except the last reader in
//! the producer's branch, which takes it). `Opaque` carries anything the engine must not look inside (a Python
//! object, a tensor, a handle): it is never hashed or serialized and compares by identity.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A value on an edge. Cloning is O(1).
#[derive(Clone)]
pub enum Value {
    /// Nothing.
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// UTF-8 text.
    Text(Arc<str>),
    /// Raw bytes.
    Bytes(Arc<[u8]>),
    /// An ordered list.
    List(Arc<[Value]>),
    /// Ordered pairs keyed by text: fan-in inputs keyed by source id, leaf outputs keyed by
    /// leaf id, in a deterministic order.
    Map(Arc<[(Arc<str>, Value)]>),
    /// Anything else, carried untouched and compared by identity.
    Opaque(Arc<dyn Any + Send + Sync>),
}

impl Value {
    /// Builds text.
    pub fn text(s: impl Into<Arc<str>>) -> Self {
        Value::Text(s.into())
    }

    /// Builds a list.
    pub fn list(items: impl IntoIterator<Item = Value>) -> Self {
        Value::List(items.into_iter().collect())
    }

    /// Builds a map from ordered pairs.
    pub fn map<K: Into<Arc<str>>>(pairs: impl IntoIterator<Item = (K, Value)>) -> Self {
        Value::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// Wraps anything as an opaque value.
    pub fn opaque<T: Any + Send + Sync>(inner: T) -> Self {
        Value::Opaque(Arc::new(inner))
    }

    /// The variant's name, for messages about what a node could not read.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "Null",
            Value::Bool(_) => "Bool",
            Value::Int(_) => "Int",
            Value::Float(_) => "Float",
            Value::Text(_) => "Text",
            Value::Bytes(_) => "Bytes",
            Value::List(_) => "List",
            Value::Map(_) => "Map",
            Value::Opaque(_) => "Opaque",
        }
    }

    /// The integer, if this is an `Int`.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The float, if this is a `Float` (an `Int` is not silently widened).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(x) => Some(*x),
            _ => None,
        }
    }

    /// The text, if this is `Text`.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The items, if this is a `List`.
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(items) => Some(items),
            _ => None,
        }
    }

    /// The pairs, if this is a `Map`.
    pub fn as_map(&self) -> Option<&[(Arc<str>, Value)]> {
        match self {
            Value::Map(pairs) => Some(pairs),
            _ => None,
        }
    }

    /// The value under `key`, if this is a `Map` holding it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map()?
            .iter()
            .find_map(|(k, v)| (&**k == key).then_some(v))
    }

    /// The opaque payload downcast to `T`, if this is an `Opaque` holding a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        match self {
            Value::Opaque(inner) => inner.downcast_ref::<T>(),
            _ => None,
        }
    }
}

impl PartialEq for Value {
    /// Structural for native variants; identity (`Arc::ptr_eq`) for `Opaque`.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            #[allow(clippy::float_cmp)] // Equality of values, not of approximations.
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Text(a), Value::Text(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            (Value::List(a), Value::List(b)) => a == b,
            (Value::Map(a), Value::Map(b)) => a == b,
            (Value::Opaque(a), Value::Opaque(b)) => Arc::ptr_eq(a, b),
            (
                Value::Null
                | Value::Bool(_)
                | Value::Int(_)
                | Value::Float(_)
                | Value::Text(_)
                | Value::Bytes(_)
                | Value::List(_)
                | Value::Map(_)
                | Value::Opaque(_),
                _,
            ) => false,
        }
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("Null"),
            Value::Bool(b) => write!(f, "Bool({b})"),
            Value::Int(i) => write!(f, "Int({i})"),
            Value::Float(x) => write!(f, "Float({x:?})"),
            Value::Text(s) => write!(f, "Text({:?})", &**s),
            Value::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Value::List(items) => f.debug_list().entries(items.iter()).finish(),
            Value::Map(pairs) => f
                .debug_map()
                .entries(pairs.iter().map(|(k, v)| (&**k, v)))
                .finish(),
            Value::Opaque(inner) => write!(f, "Opaque({:p})", Arc::as_ptr(inner)),
        }
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.into())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s.into())
    }
}
