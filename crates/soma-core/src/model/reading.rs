//! `Reading`: how the engine looks into the values its decisions act on.
//!
//! A `Map` step splits what it reads into items and puts its results back into one value, a
//! `Switch` reads a key from its selector's output, a `Loop` reads whether its predicate said
//! done (as a truth value, as Python reads one). The engine's own values ([`Value::List`], [`Value::Text`], [`Value::Bool`]) read as
//! those directly ([`NativeReading`]); an embedder whose values are opaque to the engine (a
//! Python object) gives the executor a reading of its own ([`crate::Executor::with_reading`]).

use crate::model::node::NodeError;
use crate::model::value::Value;

/// Why a `Map` step's input gave no items.
#[derive(Debug)]
pub enum NotItems {
    /// It is no list of items: the type it is, as a person would name it.
    NotAList(String),
    /// Reading its items failed (a lazy dataset's `OSError`, a Ctrl-C): the error, which the
    /// step's failure carries untouched.
    Failed(NodeError),
}

/// How a decision reads a value; see the module docs. Each method that can fail returns the
/// type of what it was given, as a person would name it, for the error that names the step.
pub trait Reading: Send + Sync {
    /// The items of a `Map` step's input, in order.
    ///
    /// # Errors
    /// [`NotItems::NotAList`] when `value` is no list of items; [`NotItems::Failed`] when
    /// reading them failed.
    fn items(&self, value: &Value) -> Result<Vec<Value>, NotItems>;
    /// A `Map` step's output: its items' results, in input order.
    fn collect(&self, results: Vec<Value>) -> Value;
    /// The case key a `Switch` step's selector returned.
    ///
    /// # Errors
    /// The type of `value` when it is no key.
    fn key(&self, value: &Value) -> Result<String, String>;
    /// Whether a `Loop` step's predicate said done: its output read as true or false.
    fn done(&self, value: &Value) -> bool;
    /// The type of `value`, for an error message.
    fn type_name(&self, value: &Value) -> String;
}

/// The reading of the engine's own values: a list's items, text as a key, a boolean as done.
pub struct NativeReading;

impl Reading for NativeReading {
    fn items(&self, value: &Value) -> Result<Vec<Value>, NotItems> {
        match value {
            Value::List(items) => Ok(items.to_vec()),
            other => Err(NotItems::NotAList(self.type_name(other))),
        }
    }

    fn collect(&self, results: Vec<Value>) -> Value {
        Value::List(results.into())
    }

    fn key(&self, value: &Value) -> Result<String, String> {
        match value {
            Value::Text(key) => Ok(key.to_string()),
            Value::Int(key) => Ok(key.to_string()),
            Value::Bool(key) => Ok(key.to_string()),
            other => Err(self.type_name(other)),
        }
    }

    fn done(&self, value: &Value) -> bool {
        match value {
            Value::Bool(done) => *done,
            Value::Null => false,
            Value::Int(n) => *n != 0,
            Value::Float(x) => *x != 0.0,
            Value::Text(text) => !text.is_empty(),
            Value::Bytes(bytes) => !bytes.is_empty(),
            Value::List(items) => !items.is_empty(),
            Value::Map(pairs) => !pairs.is_empty(),
            Value::Opaque(_) => true,
        }
    }

    fn type_name(&self, value: &Value) -> String {
        match value {
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
        .to_owned()
    }
}
