//! `Value`: what flows along edges.
//!
//! Every variant clones in O(1) — scalars by copy, everything else by `Arc` — because the
//! executor hands the same value to every reader (a clone per reader, except the last reader in
//! the producer's branch, which takes it). `Opaque` carries anything the engine must not look inside (a Python
//! object, a tensor, a handle): it is never hashed or serialized and compares by identity.
//!
//! A value may nest as deep as whoever builds it likes — a list of a list of a list, thousands
//! of levels — so nothing here recurses per level: dropping, comparing and printing walk an
//! explicit stack (cloning is one reference count, at any depth).

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

impl Drop for Value {
    /// Empties the value of the lists and maps it alone holds onto a stack of its own, and
    /// drops them from there, each emptied the same way first: a deep value drops in a loop,
    /// where the derived drop would recurse once per level.
    ///
    /// A list or map shared with another value is left whole: its reference count goes down
    /// and the other holder drops it later, the same way. (Two threads dropping the last two
    /// holders at once may each see the other, and the last one's drop then empties the items
    /// one level down rather than here: one frame more, not one per level.)
    // Inlined, so that dropping a scalar, text or an opaque value — what passes from node to
    // node — costs the one check that it holds no list or map, with no stack set up.
    #[inline]
    fn drop(&mut self) {
        if matches!(self, Value::List(_) | Value::Map(_)) {
            self.drop_nested();
        }
    }
}

impl Value {
    /// Empties this list or map of what it alone holds, level by level from a stack (see
    /// [`Drop`]).
    #[inline(never)]
    fn drop_nested(&mut self) {
        let mut stack = Vec::new();
        self.take_nested(&mut stack);
        while let Some(mut value) = stack.pop() {
            value.take_nested(&mut stack);
        }
    }

    /// Moves onto `stack` the lists and maps directly inside this one, if it holds them alone,
    /// leaving `Null` in their place. Scalars, text, bytes and opaque values stay: dropping
    /// them recurses into no value.
    fn take_nested(&mut self, stack: &mut Vec<Value>) {
        let mut take = |item: &mut Value| {
            if matches!(item, Value::List(_) | Value::Map(_)) {
                stack.push(std::mem::replace(item, Value::Null));
            }
        };
        match self {
            Value::List(items) => {
                if let Some(items) = Arc::get_mut(items) {
                    items.iter_mut().for_each(take);
                }
            }
            Value::Map(pairs) => {
                if let Some(pairs) = Arc::get_mut(pairs) {
                    for (_, item) in pairs.iter_mut() {
                        take(item);
                    }
                }
            }
            Value::Null
            | Value::Bool(_)
            | Value::Int(_)
            | Value::Float(_)
            | Value::Text(_)
            | Value::Bytes(_)
            | Value::Opaque(_) => {}
        }
    }
}

impl PartialEq for Value {
    /// Structural for native variants; identity (`Arc::ptr_eq`) for `Opaque`. Pair by pair
    /// from a stack, in the order the derived comparison would go, so depth costs no stack.
    fn eq(&self, other: &Self) -> bool {
        let mut pairs = vec![(self, other)];
        while let Some(pair) = pairs.pop() {
            let same = match pair {
                (Value::Null, Value::Null) => true,
                (Value::Bool(a), Value::Bool(b)) => a == b,
                (Value::Int(a), Value::Int(b)) => a == b,
                #[allow(clippy::float_cmp)] // Equality of values, not of approximations.
                (Value::Float(a), Value::Float(b)) => a == b,
                (Value::Text(a), Value::Text(b)) => a == b,
                (Value::Bytes(a), Value::Bytes(b)) => a == b,
                (Value::List(a), Value::List(b)) => {
                    pairs.extend(a.iter().zip(b.iter()).rev());
                    a.len() == b.len()
                }
                (Value::Map(a), Value::Map(b)) => {
                    pairs.extend(a.iter().zip(b.iter()).rev().map(|((_, x), (_, y))| (x, y)));
                    a.len() == b.len() && a.iter().zip(b.iter()).all(|((j, _), (k, _))| j == k)
                }
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
            };
            if !same {
                return false;
            }
        }
        true
    }
}

/// One step of a walk over a value, depth first: a value entered (under its key, inside a
/// map), or a list or map left once all its items were.
pub(crate) enum Visit<'v> {
    Enter(Option<&'v str>, &'v Value),
    Leave(&'v Value),
}

impl Value {
    /// Every value inside this one, depth first, as `Enter` and `Leave` steps, from a stack.
    pub(crate) fn visits(&self) -> impl Iterator<Item = Visit<'_>> {
        let mut stack = vec![Visit::Enter(None, self)];
        std::iter::from_fn(move || {
            let next = stack.pop()?;
            if let Visit::Enter(_, entered) = next {
                match entered {
                    Value::List(items) => {
                        stack.push(Visit::Leave(entered));
                        stack.extend(items.iter().rev().map(|item| Visit::Enter(None, item)));
                    }
                    Value::Map(pairs) => {
                        stack.push(Visit::Leave(entered));
                        stack.extend(
                            pairs
                                .iter()
                                .rev()
                                .map(|(key, item)| Visit::Enter(Some(&**key), item)),
                        );
                    }
                    Value::Null
                    | Value::Bool(_)
                    | Value::Int(_)
                    | Value::Float(_)
                    | Value::Text(_)
                    | Value::Bytes(_)
                    | Value::Opaque(_) => {}
                }
            }
            Some(next)
        })
    }

    /// A scalar as `Debug` prints it; `None` for a list or map, which the walk prints.
    fn write_scalar(&self, f: &mut fmt::Formatter<'_>) -> Option<fmt::Result> {
        Some(match self {
            Value::Null => f.write_str("Null"),
            Value::Bool(b) => write!(f, "Bool({b})"),
            Value::Int(i) => write!(f, "Int({i})"),
            Value::Float(x) => write!(f, "Float({x:?})"),
            Value::Text(s) => write!(f, "Text({:?})", &**s),
            Value::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Value::Opaque(inner) => write!(f, "Opaque({:p})", Arc::as_ptr(inner)),
            Value::List(_) | Value::Map(_) => return None,
        })
    }

    /// The brackets around a list's or a map's items, and whether it has none.
    fn brackets(&self) -> (&'static str, &'static str, bool) {
        match self {
            Value::List(items) => ("[", "]", items.is_empty()),
            Value::Map(pairs) => ("{", "}", pairs.is_empty()),
            Value::Null
            | Value::Bool(_)
            | Value::Int(_)
            | Value::Float(_)
            | Value::Text(_)
            | Value::Bytes(_)
            | Value::Opaque(_) => ("", "", true),
        }
    }
}

impl fmt::Debug for Value {
    /// Lists as `[a, b]`, maps as `{"k": v}`, as `debug_list` and `debug_map` print them, `{:#?}`
    /// an item per line included — written from one walk: nesting them would recurse once per
    /// level.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pretty = f.alternate();
        let pad = |f: &mut fmt::Formatter<'_>, depth: usize| -> fmt::Result {
            (0..depth).try_for_each(|_| f.write_str("    "))
        };
        // How many lists and maps enclose the value being written, and whether it is the first
        // item of the innermost one.
        let mut depth = 0;
        let mut first = true;
        for visit in self.visits() {
            match visit {
                Visit::Enter(key, value) => {
                    if depth > 0 {
                        if pretty {
                            pad(f, depth)?;
                        } else if !first {
                            f.write_str(", ")?;
                        }
                    }
                    if let Some(key) = key {
                        write!(f, "{key:?}: ")?;
                    }
                    first = false;
                    if let Some(written) = value.write_scalar(f) {
                        written?;
                        if pretty && depth > 0 {
                            f.write_str(",\n")?;
                        }
                    } else {
                        let (open, _, empty) = value.brackets();
                        f.write_str(open)?;
                        if pretty && !empty {
                            f.write_str("\n")?;
                        }
                        depth += 1;
                        first = true;
                    }
                }
                Visit::Leave(value) => {
                    let (_, close, empty) = value.brackets();
                    depth -= 1;
                    if pretty && !empty {
                        pad(f, depth)?;
                    }
                    f.write_str(close)?;
                    if pretty && depth > 0 {
                        f.write_str(",\n")?;
                    }
                    first = false;
                }
            }
        }
        Ok(())
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
