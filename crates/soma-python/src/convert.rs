//! Values across the boundary: Python objects travel untouched, natives convert on demand.
//!
//! A Python object enters the engine wrapped, not converted ([`PyValue`] inside
//! `Value::Opaque`), so the next Python node receives the very same object — an int stays an
//! int, a tensor the same tensor, with no copy. Conversion to native values happens only where
//! a Rust node reads its input ([`to_native`]), and back where Python reads a native value
//! ([`to_python`]).
//!
//! A value may nest as deep as its maker likes (a list of a list of … thousands of levels), so
//! converting one never recurses per level: [`convert`] walks any tree from a stack of its own,
//! building each list or map once all its items are built. A Python list that contains itself
//! is refused with a `ValueError` rather than converted forever. A list held in several places
//! converts once, either way: the native values share it, as any clone does, and a shared
//! native list comes back as one Python list held in those places — so a conversion costs the
//! size of the value, never the number of paths through it.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use soma_core::Value;

/// A Python object carried through the engine as it is.
pub struct PyValue(pub Py<PyAny>);

/// Wraps a Python object for the engine, without converting it.
pub fn wrap(object: Bound<'_, PyAny>) -> Value {
    Value::Opaque(Arc::new(PyValue(object.unbind())))
}

/// Wraps `object` for the engine as [`wrap`] does, in the box `spare` — an input its call
/// is done with — holds, when `spare` wraps a Python object alone: that object let go
/// and `Null` left in its place, with no allocation made (and none freed when `spare` drops).
#[inline]
pub fn wrap_into(spare: &mut Value, object: Bound<'_, PyAny>) -> Value {
    let py = object.py();
    if let Value::Opaque(inner) = spare {
        if let Some(held) = Arc::get_mut(inner).and_then(|inner| inner.downcast_mut::<PyValue>()) {
            std::mem::replace(&mut held.0, object.unbind()).drop_ref(py);
            return std::mem::replace(spare, Value::Null);
        }
    }
    wrap(object)
}

/// What converting one element of a tree found: its converted form, or the items to convert
/// first and what [`Conversion::close`] needs to put them together.
enum Step<Item, Converted, Shape> {
    Done(Converted),
    Open { items: Vec<Item>, shape: Shape },
}

/// One way of converting a tree (Python objects to values, values to Python objects, values
/// to native values), element by element, for [`convert`] to drive.
trait Conversion {
    type Item;
    type Converted;
    /// What a container keeps while its items convert: its kind, its keys.
    type Shape;

    /// Converts `item`, or opens it.
    fn step(
        &mut self,
        item: Self::Item,
    ) -> PyResult<Step<Self::Item, Self::Converted, Self::Shape>>;

    /// Builds an opened container from its items' converted forms, in order.
    fn close(
        &mut self,
        shape: Self::Shape,
        items: Vec<Self::Converted>,
    ) -> PyResult<Self::Converted>;
}

/// Converts the tree under `root`, depth first, from a stack: each opened container waits on
/// it with its items still to convert and those converted so far.
fn convert<C: Conversion>(conversion: &mut C, root: C::Item) -> PyResult<C::Converted> {
    struct Opened<C: Conversion> {
        items: std::vec::IntoIter<C::Item>,
        converted: Vec<C::Converted>,
        shape: C::Shape,
    }
    let mut stack: Vec<Opened<C>> = Vec::new();
    let mut next = root;
    loop {
        let mut finished = match conversion.step(next)? {
            Step::Done(converted) => Some(converted),
            Step::Open { items, shape } => {
                stack.push(Opened {
                    converted: Vec::with_capacity(items.len()),
                    items: items.into_iter(),
                    shape,
                });
                None
            }
        };
        loop {
            let Some(top) = stack.last_mut() else {
                return Ok(finished.expect("the root is finished when nothing is left open"));
            };
            if let Some(converted) = finished.take() {
                top.converted.push(converted);
            }
            if let Some(item) = top.items.next() {
                next = item;
                break;
            }
            let done = stack.pop().expect("the top of the stack");
            finished = Some(conversion.close(done.shape, done.converted)?);
        }
    }
}

/// The keys of a map being converted, or none for a list.
type Keys<'v> = Option<&'v [(Arc<str>, Value)]>;

/// Where a list's or a map's items live: the same for every clone of it, so it names the
/// list or map shared by all of them. An empty one has no items to share and converts anew.
fn shared(value: &Value) -> Option<*const ()> {
    match value {
        Value::List(items) if !items.is_empty() => Some(items.as_ptr().cast()),
        Value::Map(pairs) if !pairs.is_empty() => Some(pairs.as_ptr().cast()),
        Value::List(_)
        | Value::Map(_)
        | Value::Null
        | Value::Bool(_)
        | Value::Int(_)
        | Value::Float(_)
        | Value::Text(_)
        | Value::Bytes(_)
        | Value::Opaque(_) => None,
    }
}

/// What Python sees of a value: a wrapped object is itself; natives become Python natives;
/// a map becomes a `dict` in the same order. A list or map that the value holds in several
/// places becomes one Python object held in those places, as a Python list put in several
/// places and converted by [`to_native`] was: the conversion costs the size of the value, not
/// of every path through it.
// Inlined: what passes between Python nodes, every time, is the object itself, told by one
// check; only the conversion of other values is a call of its own.
#[inline]
pub fn to_python<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    match wrapped(value) {
        Some(object) => Ok(object.bind(py).clone()),
        None => converted(py, value),
    }
}

/// The Python object `value` wraps, if it wraps one ([`wrap`]): borrowed, for a caller that
/// only hands it on while `value` lives (a node's call), with no reference count changed.
#[inline]
pub fn wrapped(value: &Value) -> Option<&Py<PyAny>> {
    let Value::Opaque(inner) = value else {
        return None;
    };
    inner
        .downcast_ref::<PyValue>()
        .map(|PyValue(object)| object)
}

/// [`to_python`] for a value that wraps no Python object: converted, with the walk set up.
#[inline(never)]
fn converted<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    convert(
        &mut ToPython {
            py,
            built: HashMap::new(),
            values: PhantomData,
        },
        value,
    )
}

/// Builds Python objects from values borrowed for `'v`.
struct ToPython<'v, 'py> {
    py: Python<'py>,
    /// Each shared list or map built so far, by [`shared`].
    built: HashMap<*const (), Bound<'py, PyAny>>,
    values: PhantomData<&'v Value>,
}

impl<'v, 'py> Conversion for ToPython<'v, 'py> {
    type Item = &'v Value;
    type Converted = Bound<'py, PyAny>;
    type Shape = (Keys<'v>, Option<*const ()>);

    fn step(
        &mut self,
        value: &'v Value,
    ) -> PyResult<Step<&'v Value, Bound<'py, PyAny>, Self::Shape>> {
        let py = self.py;
        let shared = shared(value);
        if let Some(built) = shared.and_then(|at| self.built.get(&at)) {
            return Ok(Step::Done(built.clone()));
        }
        Ok(match value {
            Value::List(items) => Step::Open {
                items: items.iter().collect(),
                shape: (None, shared),
            },
            Value::Map(pairs) => Step::Open {
                items: pairs.iter().map(|(_, item)| item).collect(),
                shape: (Some(pairs), shared),
            },
            Value::Null => Step::Done(py.None().into_bound(py)),
            Value::Bool(b) => Step::Done(PyBool::new(py, *b).to_owned().into_any()),
            Value::Int(i) => Step::Done(i.into_pyobject(py)?.into_any()),
            Value::Float(x) => Step::Done(PyFloat::new(py, *x).into_any()),
            Value::Text(s) => Step::Done(PyString::new(py, s).into_any()),
            Value::Bytes(b) => Step::Done(PyBytes::new(py, b).into_any()),
            Value::Opaque(inner) => match inner.downcast_ref::<PyValue>() {
                Some(PyValue(object)) => Step::Done(object.bind(py).clone()),
                None => {
                    return Err(PyTypeError::new_err(
                        "a Rust node produced an opaque value that Python cannot read\nhint: have the Rust node return a native value",
                    ))
                }
            },
        })
    }

    fn close(
        &mut self,
        (keys, shared): Self::Shape,
        items: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        let built = match keys {
            None => PyList::new(py, items)?.into_any(),
            Some(pairs) => {
                let dict = PyDict::new(py);
                for ((key, _), item) in pairs.iter().zip(items) {
                    dict.set_item(&**key, item)?;
                }
                dict.into_any()
            }
        };
        if let Some(at) = shared {
            self.built.insert(at, built.clone());
        }
        Ok(built)
    }
}
/// Whether reading `value` natively needs the interpreter. A list or map met twice (a value
/// can share one in many places) is looked into once. Asked of every Rust node's input, so a
/// scalar, and the items of a flat list or map, are answered without allocating: only lists and
/// maps nested inside another wait on a stack.
pub fn holds_python(value: &Value) -> bool {
    let mut nested: Vec<&Value> = Vec::new();
    let mut seen: HashSet<*const ()> = HashSet::new();
    let mut next = Some(value);
    while let Some(value) = next.take().or_else(|| nested.pop()) {
        let found = match value {
            Value::List(items) => look_into(items.iter(), &mut nested, &mut seen),
            Value::Map(pairs) => {
                look_into(pairs.iter().map(|(_, item)| item), &mut nested, &mut seen)
            }
            Value::Opaque(inner) => inner.is::<PyValue>(),
            Value::Null
            | Value::Bool(_)
            | Value::Int(_)
            | Value::Float(_)
            | Value::Text(_)
            | Value::Bytes(_) => false,
        };
        if found {
            return true;
        }
    }
    false
}

/// Whether one of `items` is a Python object; the lists and maps among them, unless `seen`
/// already, go on `nested` to be looked into.
fn look_into<'v>(
    items: impl Iterator<Item = &'v Value>,
    nested: &mut Vec<&'v Value>,
    seen: &mut HashSet<*const ()>,
) -> bool {
    for item in items {
        match item {
            Value::Opaque(inner) => {
                if inner.is::<PyValue>() {
                    return true;
                }
            }
            Value::List(_) | Value::Map(_) => {
                if shared(item).is_some_and(|at| seen.insert(at)) {
                    nested.push(item);
                }
            }
            Value::Null
            | Value::Bool(_)
            | Value::Int(_)
            | Value::Float(_)
            | Value::Text(_)
            | Value::Bytes(_) => {}
        }
    }
    false
}

/// The native value of `value`, converting any Python object inside it.
///
/// # Errors
/// `TypeError` naming the Python type that has no native form, and what to do instead;
/// `ValueError` for a list or dict that contains itself.
pub fn to_native(py: Python<'_>, value: &Value) -> PyResult<Value> {
    convert(&mut ToNative(FromPython::new(py), PhantomData), value)
}

/// Rebuilds a value with each Python object in it converted by the [`FromPython`] it holds,
/// which remembers what it converted across all of them.
struct ToNative<'v, 'py>(FromPython<'py>, PhantomData<&'v Value>);

impl<'v> Conversion for ToNative<'v, '_> {
    type Item = &'v Value;
    type Converted = Value;
    type Shape = Keys<'v>;

    fn step(&mut self, value: &'v Value) -> PyResult<Step<&'v Value, Value, Keys<'v>>> {
        Ok(match value {
            Value::List(items) => Step::Open {
                items: items.iter().collect(),
                shape: None,
            },
            Value::Map(pairs) => Step::Open {
                items: pairs.iter().map(|(_, item)| item).collect(),
                shape: Some(pairs),
            },
            Value::Opaque(inner) => match inner.downcast_ref::<PyValue>() {
                Some(PyValue(object)) => {
                    let object = object.bind(self.0.py).clone();
                    Step::Done(convert(&mut self.0, object)?)
                }
                None => Step::Done(value.clone()),
            },
            Value::Null
            | Value::Bool(_)
            | Value::Int(_)
            | Value::Float(_)
            | Value::Text(_)
            | Value::Bytes(_) => Step::Done(value.clone()),
        })
    }

    fn close(&mut self, keys: Keys<'v>, items: Vec<Value>) -> PyResult<Value> {
        Ok(match keys {
            None => Value::List(items.into()),
            Some(pairs) => Value::Map(
                pairs
                    .iter()
                    .zip(items)
                    .map(|((key, _), item)| (Arc::clone(key), item))
                    .collect(),
            ),
        })
    }
}

/// A Python list or dict being converted: its items come from the snapshot taken when it was
/// opened, so nothing it runs (none of its own `__iter__`) decides what they are.
enum Container<'py> {
    List(Bound<'py, PyAny>),
    Dict(Bound<'py, PyAny>, Vec<Arc<str>>),
}

impl<'py> Container<'py> {
    fn object(&self) -> &Bound<'py, PyAny> {
        match self {
            Container::List(object) | Container::Dict(object, _) => object,
        }
    }
}

/// Converts Python objects to native values. Remembers each list and dict it converted, so one
/// held in many places converts once — and one that contains itself is found on the way down
/// rather than converted forever.
struct FromPython<'py> {
    py: Python<'py>,
    /// The containers being converted, from the root down to the current one.
    open: HashSet<*mut pyo3::ffi::PyObject>,
    /// The containers converted, kept alive so that no other object can take their address.
    done: HashMap<*mut pyo3::ffi::PyObject, (Bound<'py, PyAny>, Value)>,
}

impl<'py> FromPython<'py> {
    fn new(py: Python<'py>) -> Self {
        FromPython {
            py,
            open: HashSet::new(),
            done: HashMap::new(),
        }
    }
}

impl<'py> Conversion for FromPython<'py> {
    type Item = Bound<'py, PyAny>;
    type Converted = Value;
    type Shape = Container<'py>;

    fn step(
        &mut self,
        object: Bound<'py, PyAny>,
    ) -> PyResult<Step<Bound<'py, PyAny>, Value, Container<'py>>> {
        let is_list = object.is_instance_of::<PyList>() || object.is_instance_of::<PyTuple>();
        if !is_list && !object.is_instance_of::<PyDict>() {
            return scalar_from_python(&object).map(Step::Done);
        }
        if let Some((_, value)) = self.done.get(&object.as_ptr()) {
            return Ok(Step::Done(value.clone()));
        }
        if !self.open.insert(object.as_ptr()) {
            return Err(PyValueError::new_err(format!(
                "a Rust node cannot read a `{}` that contains itself\nhint: give it a value without cycles; keep self-referencing structures in Python nodes",
                object.get_type().name()?
            )));
        }
        if let Ok(list) = object.cast::<PyList>() {
            let items = list.iter().collect();
            return Ok(Step::Open {
                items,
                shape: Container::List(object),
            });
        }
        if let Ok(tuple) = object.cast::<PyTuple>() {
            let items = tuple.iter().collect();
            return Ok(Step::Open {
                items,
                shape: Container::List(object),
            });
        }
        let dict = object.cast::<PyDict>()?;
        let mut keys = Vec::with_capacity(dict.len());
        let mut items = Vec::with_capacity(dict.len());
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(PyTypeError::new_err(format!(
                    "a Rust node cannot read a `dict` with `{}` keys\nhint: use str keys",
                    key.get_type().name()?
                )));
            };
            keys.push(Arc::<str>::from(key.to_str()?));
            items.push(item);
        }
        Ok(Step::Open {
            items,
            shape: Container::Dict(object, keys),
        })
    }

    fn close(&mut self, shape: Container<'py>, items: Vec<Value>) -> PyResult<Value> {
        let value = match &shape {
            Container::List(_) => Value::List(items.into()),
            Container::Dict(_, keys) => Value::Map(keys.iter().cloned().zip(items).collect()),
        };
        let object = shape.object();
        self.open.remove(&object.as_ptr());
        self.done
            .insert(object.as_ptr(), (object.clone(), value.clone()));
        Ok(value)
    }
}

/// The native form of a Python object that is not a list, a tuple or a dict.
fn scalar_from_python(object: &Bound<'_, PyAny>) -> PyResult<Value> {
    if object.is_none() {
        return Ok(Value::Null);
    }
    // `bool` before `int`: in Python a bool is an int, and it must stay a bool.
    if let Ok(b) = object.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if object.is_instance_of::<PyInt>() {
        return object.extract::<i64>().map(Value::Int).map_err(|_| {
            PyTypeError::new_err(
                "a Rust node cannot read an `int` outside the 64-bit range\nhint: keep big integers in Python nodes",
            )
        });
    }
    if let Ok(x) = object.cast::<PyFloat>() {
        return Ok(Value::Float(x.value()));
    }
    if let Ok(s) = object.cast::<PyString>() {
        return Ok(Value::Text(s.to_str()?.into()));
    }
    if let Ok(b) = object.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().into()));
    }
    Err(PyTypeError::new_err(format!(
        "a Rust node cannot read a value of type `{}`\nhint: Rust nodes read None, bool, int, float, str, bytes, lists and tuples of those, and dicts with str keys; convert it in a Python node first",
        object.get_type().name()?
    )))
}
