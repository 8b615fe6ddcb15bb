//! `soma._soma.reach`: the code a class or a function of the user's reaches by name, digested,
//! with the [`Witness`] of the bindings it was read from.
//!
//! A node's key covers the code it runs (`soma/cache/_fingerprint.py` says what that is); this is
//! the walk that reads it, kept here because the first key of a node reads a dozen functions and
//! their globals, which in Python costs a hundred microseconds. From a root (a node's class, or
//! a function a node holds) it follows:
//! - a **class** of the user's: its metaclass, its bases, and each attribute of its own
//!   (methods, properties, class attributes), the few named in [`CLASS_SKIP`] aside;
//! - a **class** by its name without its module's (which says where the code was run from, not
//!   what it does) and its annotations, as they read now;
//! - a **function** of the user's: its name, its compiled code ([`crate::code`]), its defaults
//!   and keyword defaults, its closure's cells, its attributes, and each name its instructions
//!   look up as a global (a global of its module, followed; a builtin, which a later global of
//!   that name would shadow; a name not defined yet, which must stay so) or import (a module it
//!   imports in its body, absolute or relative, imported now if it is the user's and no one
//!   imported it yet). A global or a cell the code only writes to (`LOG.append(x)`,
//!   `COUNTS[k] += 1`: [`crate::code::Reads::sinks`]) holding a container or a number is not
//!   read: what a node writes on the side is not what its output is computed from;
//! - a **module** of the user's: its attributes that the code reading it looks up as attributes
//!   (`helpers.scale`), followed in turn, and its `__getattr__` (PEP 562) where one of them is
//!   not defined; a bound method: its function and its object;
//! - what is not the user's — a class, a function or a module of an installed library or of
//!   Python itself — by its name only.
//!
//! What cannot change in place (numbers, strings, bytes, code, tuples and frozensets of those)
//! is fed as it is. Anything else the code reads — a list, a dict, an array, an object — is
//! *volatile*: marked in the digest, and its binding marked in the witness, whose `current()`
//! hands it back on every run to be digested as a value then.
//!
//! Whether code is the user's is decided by the file it was compiled from, which Python tells
//! (`soma.cache._fingerprint._users_file`, which knows where libraries live): asked once per file
//! and remembered in the dict Python hands over; a module without a file, and a class whose module
//! is not registered, are asked of Python's `users(object)`.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyBytes, PyCode, PyComplex, PyDict, PyFloat, PyFrozenSet, PyFunction, PyInt, PyModule,
    PyString, PyTuple, PyType,
};

use crate::code::{code_facts, feed_constant, Reads};
use crate::witness::{unless_interrupted, Binding, Held, Owner, Witness};

/// Attributes of a class that are not its code's: its layout's descriptors, names its digest
/// has already, caches Python keeps on it (an ABC's, the slot names `copyreg` notes when an
/// instance is first pickled), and records its generated methods' code already reflects
/// (dataclass fields), which would otherwise be digested on every run. Its annotations are
/// read apart (`CodeWalk::annotation`).
const CLASS_SKIP: [&str; 12] = [
    "__dict__",
    "__weakref__",
    "__module__",
    "__qualname__",
    "_abc_impl",
    "__slotnames__",
    "__dataclass_fields__",
    "__dataclass_params__",
    "__orig_bases__",
    "__parameters__",
    "__firstlineno__",
    "__static_attributes__",
];

/// A hash of object addresses: they are spread already, and `SipHash`'s defence against keys
/// chosen by an attacker buys nothing here, where the keys are this process's own pointers.
#[derive(Default)]
struct ByAddress(u64);

impl Hasher for ByAddress {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map or set keyed by object addresses.
type ByAddressMap<K, V> = HashMap<K, V, BuildHasherDefault<ByAddress>>;
type ByAddressSet<K> = HashSet<K, BuildHasherDefault<ByAddress>>;

/// The types the walk tells apart, and `sys.modules`, looked up once.
struct Kinds {
    method: Py<PyType>,
    builtins: [Py<PyType>; 5],
    descriptors: [Py<PyType>; 2],
    staticmethod: Py<PyType>,
    classmethod: Py<PyType>,
    property: Py<PyType>,
    cached_property: Py<PyType>,
    modules: Py<PyDict>,
    /// What code that only writes to a value may leave out of the key: the containers whose
    /// mutators change them in place and answer nothing.
    sinks: Vec<Py<PyType>>,
}

fn kinds(py: Python<'_>) -> PyResult<&Kinds> {
    static KINDS: PyOnceLock<Kinds> = PyOnceLock::new();
    KINDS.get_or_try_init(py, || {
        let types = py.import("types")?;
        let builtins = py.import("builtins")?;
        let functools = py.import("functools")?;
        let of = |module: &Bound<'_, PyModule>, name: &str| -> PyResult<Py<PyType>> {
            Ok(module.getattr(name)?.cast_into::<PyType>()?.unbind())
        };
        Ok(Kinds {
            method: of(&types, "MethodType")?,
            builtins: [
                of(&types, "BuiltinFunctionType")?,
                of(&types, "MethodDescriptorType")?,
                of(&types, "WrapperDescriptorType")?,
                of(&types, "MethodWrapperType")?,
                of(&types, "ClassMethodDescriptorType")?,
            ],
            descriptors: [
                of(&types, "GetSetDescriptorType")?,
                of(&types, "MemberDescriptorType")?,
            ],
            staticmethod: of(&builtins, "staticmethod")?,
            classmethod: of(&builtins, "classmethod")?,
            property: of(&builtins, "property")?,
            cached_property: of(&functools, "cached_property")?,
            sinks: {
                let collections = py.import("collections")?;
                vec![
                    of(&builtins, "list")?,
                    of(&builtins, "dict")?,
                    of(&builtins, "set")?,
                    of(&collections, "deque")?,
                    of(&collections, "Counter")?,
                    of(&collections, "defaultdict")?,
                    of(&collections, "OrderedDict")?,
                ]
            },
            modules: py
                .import("sys")?
                .getattr("modules")?
                .cast_into::<PyDict>()?
                .unbind(),
        })
    })
}

/// Where an object lies, as a path through the code that reads it (`Ten.forward >
/// helpers.a4 > helpers.SCALE`), made into text only for a volatile binding.
struct Place<'py> {
    parent: Option<Rc<Place<'py>>>,
    /// `.`, `[]`-less names (attributes), or ` > ` before a place named afresh (a global).
    join: &'static str,
    name: PlaceName<'py>,
}

enum PlaceName<'py> {
    Static(&'static str),
    Name(Bound<'py, PyString>),
    Text(String),
    /// A closure cell, by its variable's name: `<k>`.
    Cell(Bound<'py, PyString>),
    /// A module's global: `helpers.SCALE`.
    Global(Rc<str>, Bound<'py, PyString>),
}

impl Place<'_> {
    fn text(&self) -> String {
        let mut parts = Vec::new();
        let mut at = Some(self);
        while let Some(place) = at {
            parts.push((place.join, &place.name));
            at = place.parent.as_deref();
        }
        let mut out = String::new();
        for (index, (join, name)) in parts.into_iter().rev().enumerate() {
            if index > 0 {
                out.push_str(join);
            }
            match name {
                PlaceName::Static(name) => out.push_str(name),
                PlaceName::Name(name) => out.push_str(&name.to_string_lossy()),
                PlaceName::Text(name) => out.push_str(name),
                PlaceName::Cell(name) => {
                    out.push('<');
                    out.push_str(&name.to_string_lossy());
                    out.push('>');
                }
                PlaceName::Global(module, name) => {
                    out.push_str(module);
                    out.push('.');
                    out.push_str(&name.to_string_lossy());
                }
            }
        }
        out
    }
}

/// A visit of `object`, read through `read` of `owner` by code that looks up `names`.
fn read_by<'py>(
    owner: &Bound<'py, PyAny>,
    names: &Names<'py>,
    object: Bound<'py, PyAny>,
    place: Rc<Place<'py>>,
    read: Read<'py>,
    always: bool,
) -> Item<'py> {
    Item::Visit(Visit {
        object,
        place,
        names: Rc::clone(names),
        owner: Some(owner.clone()),
        read: Some(read),
        always,
    })
}

fn place<'py>(parent: &Rc<Place<'py>>, join: &'static str, name: PlaceName<'py>) -> Rc<Place<'py>> {
    Rc::new(Place {
        parent: Some(Rc::clone(parent)),
        join,
        name,
    })
}

/// What a binding read, before the object it found is known: the kinds of [`Binding`] the
/// walk makes.
enum Read<'py> {
    Attribute(Bound<'py, PyString>),
    Vars(Bound<'py, PyString>),
    Global(Bound<'py, PyString>),
    Cell(usize),
    Item(Bound<'py, PyString>),
}

impl Read<'_> {
    fn binding(&self, found: &Bound<'_, PyAny>) -> Binding {
        let expected = Held::of(found);
        match self {
            Read::Attribute(name) => Binding::Attribute {
                name: name.clone().unbind(),
                expected,
            },
            Read::Vars(name) => Binding::Vars {
                name: name.clone().into_any().unbind(),
                expected,
            },
            Read::Global(name) => Binding::Global {
                name: name.clone().into_any().unbind(),
                expected,
            },
            Read::Cell(index) => Binding::Cell {
                index: *index,
                expected: Some(expected),
            },
            Read::Item(key) => Binding::Item {
                key: key.clone().into_any().unbind(),
                expected,
            },
        }
    }
}

/// The attribute names a function's code looks up, shared by what it reads: a module of the
/// user's it reads is followed by these names.
type Names<'py> = Rc<Vec<Bound<'py, PyString>>>;

/// One object to feed: read through `read` of `owner`, at `place`, by code that looks up
/// `names`. `always`: whether to record the binding even when its object cannot change in place
/// (false where another check covers it already).
struct Visit<'py> {
    object: Bound<'py, PyAny>,
    place: Rc<Place<'py>>,
    names: Names<'py>,
    owner: Option<Bound<'py, PyAny>>,
    read: Option<Read<'py>>,
    always: bool,
}

/// The kinds of code a walk follows.
#[derive(Clone, Copy)]
enum Code {
    Function,
    Class,
    Module,
    /// A function or method written in C: by name, and what it is bound to.
    Builtin,
    /// A bound method.
    Method,
    /// A `staticmethod` (`y`), a `classmethod` (`Y`) or a `functools.cached_property` (`Q`),
    /// by the function it wraps, its attribute named here.
    Wrapped(u8, &'static str),
    Property,
}

/// What the walk's stack holds: bytes to feed when it gets there, or an object to visit.
enum Item<'py> {
    /// A one-byte mark.
    Mark(u8),
    /// A count of what follows.
    Count(usize),
    /// A mark and a name.
    Named(u8, Bound<'py, PyString>),
    Visit(Visit<'py>),
}

/// An owner met in a walk, its bindings (each with whether it is volatile), and the places of
/// its volatile ones, in order.
type Owned<'py> = (Bound<'py, PyAny>, Vec<(Binding, bool)>, Vec<String>);

/// One walk of the code a root reaches: what it has digested so far and the owners it met.
struct CodeWalk<'py> {
    py: Python<'py>,
    kinds: &'py Kinds,
    users: Bound<'py, PyAny>,
    files: Bound<'py, PyDict>,
    users_file: Bound<'py, PyAny>,
    /// `load(name)`: the module of the user's named so, imported now, or `None`.
    load: Bound<'py, PyAny>,
    out: Vec<u8>,
    /// Each owner, its bindings, and the places of its volatile ones, in order.
    owners: Vec<Owned<'py>>,
    owner_at: ByAddressMap<usize, usize>,
    seen: ByAddressMap<usize, usize>,
    held: Vec<Bound<'py, PyAny>>,
    modules: ByAddressSet<(usize, usize)>,
    pending: Vec<Item<'py>>,
}

fn length(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn text(out: &mut Vec<u8>, tag: u8, text: &[u8]) {
    out.push(tag);
    length(out, text.len());
    out.extend_from_slice(text);
}

fn name_bytes<'a>(name: &'a Bound<'_, PyString>) -> PyResult<&'a [u8]> {
    Ok(name.to_str()?.as_bytes())
}

/// Whether `object` and all it holds cannot change in place: `None`, numbers, strings, bytes,
/// code, and tuples and frozensets of those (exactly those types, no subclass).
fn unchangeable(object: &Bound<'_, PyAny>) -> bool {
    let mut pending = vec![object.clone()];
    while let Some(object) = pending.pop() {
        let py = object.py();
        if object.is_none()
            || object.is(py.Ellipsis())
            || object.is_exact_instance_of::<PyBool>()
            || object.is_exact_instance_of::<PyInt>()
            || object.is_exact_instance_of::<PyFloat>()
            || object.is_exact_instance_of::<PyComplex>()
            || object.is_exact_instance_of::<PyString>()
            || object.is_exact_instance_of::<PyBytes>()
            || object.is_exact_instance_of::<PyCode>()
        {
            continue;
        }
        if let Ok(tuple) = object.cast_exact::<PyTuple>() {
            pending.extend(tuple.iter());
            continue;
        }
        if let Ok(set) = object.cast_exact::<PyFrozenSet>() {
            pending.extend(set.iter());
            continue;
        }
        return false;
    }
    true
}

/// `module.qualname` of a class or a function, as its attributes say.
fn qualified(object: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut out = Vec::new();
    feed_qualified(&mut out, object)?;
    Ok(String::from_utf8_lossy(&out[9..]).into_owned())
}

/// Feeds `tag`-less `module.qualname` of `object` as text (its length first), read in place.
///
/// # Errors
/// An interrupt met reading them (a metaclass's property may run Python code).
fn feed_qualified(out: &mut Vec<u8>, object: &Bound<'_, PyAny>) -> PyResult<()> {
    feed_name(out, object, true)
}

/// Feeds the `qualname` of a class or a function of the user's, without its module: the
/// module's name says where the code was run from (`__main__` as a script, `pipeline` when
/// imported, a notebook's), not what it does, and the same code run either way hits the same
/// entries.
///
/// # Errors
/// An interrupt met reading it.
fn feed_own_name(out: &mut Vec<u8>, object: &Bound<'_, PyAny>) -> PyResult<()> {
    feed_name(out, object, false)
}

fn feed_name<'py>(out: &mut Vec<u8>, object: &Bound<'py, PyAny>, module: bool) -> PyResult<()> {
    let py = object.py();
    let part = |name: &Bound<'py, PyString>| -> PyResult<Option<Bound<'py, PyString>>> {
        Ok(unless_interrupted(py, object.getattr(name))?
            .and_then(|found| found.cast_into::<PyString>().ok()))
    };
    let name = match part(intern!(py, "__qualname__"))? {
        Some(name) => Some(name),
        None => part(intern!(py, "__name__"))?,
    };
    if !module {
        let name = name
            .as_ref()
            .and_then(|found| found.to_str().ok().map(str::as_bytes))
            .unwrap_or_default();
        text(out, b'n', name);
        return Ok(());
    }
    let module = part(intern!(py, "__module__"))?;
    let text = |found: &Option<Bound<'_, PyString>>| {
        found
            .as_ref()
            .and_then(|found| found.to_str().ok().map(str::as_bytes))
            .unwrap_or_default()
            .to_vec()
    };
    let (name, module) = (text(&name), text(&module));
    out.push(b'q');
    length(out, module.len() + 1 + name.len());
    out.extend_from_slice(&module);
    out.push(b'.');
    out.extend_from_slice(&name);
    Ok(())
}

impl<'py> CodeWalk<'py> {
    fn bind(&mut self, owner: &Bound<'py, PyAny>, binding: Binding, volatile: Option<&Place<'py>>) {
        let at = *self
            .owner_at
            .entry(owner.as_ptr() as usize)
            .or_insert_with(|| {
                self.owners.push((owner.clone(), Vec::new(), Vec::new()));
                self.owners.len() - 1
            });
        self.owners[at].1.push((binding, volatile.is_some()));
        if let Some(place) = volatile {
            self.owners[at].2.push(place.text());
        }
    }

    /// Whether code compiled from `file` is the user's: remembered by file name.
    fn users_file(&self, file: &Bound<'py, PyAny>) -> PyResult<bool> {
        if let Some(known) = self.files.get_item(file)? {
            return known.is_truthy();
        }
        self.users_file.call1((file,))?.is_truthy()
    }

    /// Whether a function, a class or a module is the user's own, whose code is followed: a
    /// function by the file its code was compiled from, a module by its file; a class, and a
    /// module without a file, as Python's `users` says.
    fn users(&self, object: &Bound<'py, PyAny>) -> PyResult<bool> {
        let py = self.py;
        if object.is_instance_of::<PyFunction>() {
            let code = object.getattr(intern!(py, "__code__"))?;
            return self.users_file(&code.getattr(intern!(py, "co_filename"))?);
        }
        if object.is_instance_of::<PyModule>() {
            // Only a missing `__file__` means none: whatever else reading it raises goes on —
            // a Ctrl-C met there among it (3.13 runs Python code to word that error).
            if let Some(file) = object.getattr_opt(intern!(py, "__file__"))? {
                if file.is_instance_of::<PyString>() {
                    return self.users_file(&file);
                }
            }
        }
        self.users.call1((object,))?.is_truthy()
    }

    /// What kind of code `object` is, or `None` for a value.
    fn code_kind(&self, object: &Bound<'py, PyAny>) -> Option<Code> {
        let kinds = self.kinds;
        let kind = object.get_type();
        if object.is_instance_of::<PyFunction>() {
            Some(Code::Function)
        } else if object.is_instance_of::<PyType>() {
            Some(Code::Class)
        } else if object.is_instance_of::<PyModule>() {
            Some(Code::Module)
        } else if kinds.builtins.iter().any(|builtin| kind.is(builtin)) {
            Some(Code::Builtin)
        } else if kind.is(&kinds.method) {
            Some(Code::Method)
        } else if kind.is(&kinds.staticmethod) {
            Some(Code::Wrapped(b'y', "__func__"))
        } else if kind.is(&kinds.classmethod) {
            Some(Code::Wrapped(b'Y', "__func__"))
        } else if kind.is(&kinds.cached_property) {
            Some(Code::Wrapped(b'Q', "func"))
        } else if kind.is(&kinds.property) {
            Some(Code::Property)
        } else {
            None
        }
    }

    fn visit(&mut self, visit: Visit<'py>) -> PyResult<()> {
        let Visit {
            object,
            place,
            names,
            owner,
            read,
            always,
        } = visit;
        let bind = |walk: &mut Self, volatile: bool| {
            if let (Some(owner), Some(read)) = (&owner, &read) {
                walk.bind(owner, read.binding(&object), volatile.then_some(&*place));
            }
        };
        if unchangeable(&object) {
            let mut constant = vec![b'='];
            // Past the depth a constant is fed to here (a tuple nested deeper than any code
            // makes), it is digested as a value, which any depth costs no stack.
            if feed_constant(&mut constant, &object, 0).is_ok() {
                if always {
                    bind(self, false);
                }
                self.out.extend_from_slice(&constant);
                return Ok(());
            }
        }
        let Some(code) = self.code_kind(&object) else {
            // A value the code reads that can change in place: digested on every run.
            bind(self, true);
            self.out.push(b'V');
            return Ok(());
        };
        if always {
            bind(self, false);
        }
        if matches!(code, Code::Module) {
            return self.module(&object, &names, &place);
        }
        if let Some(at) = self.seen.get(&(object.as_ptr() as usize)) {
            self.out.push(b'^');
            length(&mut self.out, *at);
            return Ok(());
        }
        self.seen.insert(object.as_ptr() as usize, self.seen.len());
        self.held.push(object.clone());
        self.follow(code, &object, &place, &names)
    }

    /// Feeds the code `object` is, of kind `code`, met for the first time in this walk.
    fn follow(
        &mut self,
        code: Code,
        object: &Bound<'py, PyAny>,
        at: &Rc<Place<'py>>,
        names: &Names<'py>,
    ) -> PyResult<()> {
        match code {
            Code::Function if self.users(object)? => self.function(object, at)?,
            Code::Function => {
                self.out.push(b'l');
                feed_qualified(&mut self.out, object)?;
            }
            Code::Class if self.users(object)? => self.class(object.cast::<PyType>()?, at)?,
            Code::Class => {
                self.out.push(b'c');
                feed_qualified(&mut self.out, object)?;
            }
            Code::Module => self.module(object, names, at)?,
            Code::Builtin => {
                self.out.push(b'h');
                feed_qualified(&mut self.out, object)?;
                let bound = object.getattr_opt(intern!(self.py, "__self__"))?;
                match bound {
                    Some(bound) if !bound.is_none() && !bound.is_instance_of::<PyModule>() => {
                        self.out.push(b'+');
                        self.parts(object, at, names, &[("__self__", false)])?;
                    }
                    Some(_) | None => self.out.push(b'-'),
                }
            }
            Code::Method => {
                // What a bound method is bound to is fixed when it is made.
                self.out.push(b'm');
                self.parts(
                    object,
                    at,
                    names,
                    &[("__func__", false), ("__self__", false)],
                )?;
            }
            Code::Wrapped(mark, function) => {
                // What it wraps can be set again; the rest of it (a lock, a name) is no code.
                self.out.push(mark);
                self.parts(object, at, names, &[(function, true)])?;
            }
            Code::Property => {
                // A property's parts are fixed when it is made.
                self.out.push(b'p');
                let parts = [("fdel", false), ("fset", false), ("fget", false)];
                self.parts(object, at, names, &parts)?;
            }
        }
        Ok(())
    }

    /// Visits the attributes `parts` of `object`, the last one first (each with whether its
    /// binding is recorded when its object cannot change in place).
    fn parts(
        &mut self,
        object: &Bound<'py, PyAny>,
        at: &Rc<Place<'py>>,
        names: &Names<'py>,
        parts: &[(&'static str, bool)],
    ) -> PyResult<()> {
        for &(attribute, always) in parts {
            let name = PyString::intern(self.py, attribute);
            self.pending.push(Item::Visit(Visit {
                object: object.getattr(&name)?,
                place: place(at, ".", PlaceName::Static(attribute)),
                names: Rc::clone(names),
                owner: Some(object.clone()),
                read: Some(Read::Attribute(name)),
                always,
            }));
        }
        Ok(())
    }

    fn function(&mut self, function: &Bound<'py, PyAny>, at: &Rc<Place<'py>>) -> PyResult<()> {
        let py = self.py;
        let code = function.getattr(intern!(py, "__code__"))?;
        self.out.push(b'W');
        feed_own_name(&mut self.out, function)?;
        let facts = code_facts(&code)?;
        self.out.extend_from_slice(&facts.digest);
        let defaults = function.getattr(intern!(py, "__defaults__"))?;
        let kwdefaults = function.getattr(intern!(py, "__kwdefaults__"))?;
        let fixed = Binding::Function {
            code: Held::of(&code),
            defaults: Held::of(&defaults),
            kwdefaults: Held::of(&kwdefaults),
        };
        self.bind(function, fixed, None);
        let Reads {
            globals,
            attributes,
            imports,
            sinks,
            sink_cells,
        } = facts.reads(py);
        let names: Names<'py> = Rc::new(attributes);
        let mut items: Vec<Item<'py>> = Vec::with_capacity(16);
        // Its defaults and keyword defaults, whose identity the binding above checks.
        for (attribute, value) in [("__defaults__", defaults), ("__kwdefaults__", kwdefaults)] {
            let read = Read::Attribute(PyString::intern(py, attribute));
            let here = place(at, ".", PlaceName::Static(attribute));
            items.push(read_by(function, &names, value, here, read, false));
        }
        self.cells(function, &code, at, &names, &sink_cells, &mut items)?;
        let attributes = function.getattr(intern!(py, "__dict__"))?;
        if attributes.len().unwrap_or(0) > 0 {
            let read = Read::Attribute(intern!(py, "__dict__").clone());
            let here = place(at, ".", PlaceName::Static("__dict__"));
            items.push(Item::Mark(b'D'));
            items.push(read_by(function, &names, attributes, here, read, true));
        } else {
            self.bind(function, Binding::VarsLen { len: 0 }, None);
            items.push(Item::Mark(b'-'));
        }
        let read = Reads {
            globals,
            attributes: Vec::new(),
            imports,
            sinks,
            sink_cells: Vec::new(),
        };
        self.globals(function, at, &names, &read, &mut items)?;
        self.pending.extend(items.into_iter().rev());
        Ok(())
    }

    /// Appends to `items` the contents of `function`'s closure cells, each by its binding.
    fn cells(
        &mut self,
        function: &Bound<'py, PyAny>,
        code: &Bound<'py, PyAny>,
        at: &Rc<Place<'py>>,
        names: &Names<'py>,
        sinks: &[Bound<'py, PyString>],
        items: &mut Vec<Item<'py>>,
    ) -> PyResult<()> {
        let py = self.py;
        let closure = function.getattr(intern!(py, "__closure__"))?;
        let cells: Vec<_> = match closure.cast::<PyTuple>() {
            Ok(cells) => cells.iter().collect(),
            Err(_) => Vec::new(),
        };
        items.push(Item::Count(cells.len()));
        if cells.is_empty() {
            return Ok(());
        }
        let freevars = code.getattr(intern!(py, "co_freevars"))?;
        let freevars = freevars.cast::<PyTuple>()?;
        for (index, cell) in cells.iter().enumerate() {
            let contents = match cell.getattr(intern!(py, "cell_contents")) {
                Ok(contents) => Some(contents),
                Err(empty) if empty.is_instance_of::<PyValueError>(py) => None,
                Err(raised) => return Err(raised),
            };
            let Some(contents) = contents else {
                // A cell not assigned yet.
                let empty = Binding::Cell {
                    index,
                    expected: None,
                };
                self.bind(function, empty, None);
                items.push(Item::Mark(b'E'));
                continue;
            };
            let variable = freevars
                .get_item(index)
                .ok()
                .and_then(|name| name.cast_into::<PyString>().ok());
            if variable.as_ref().is_some_and(|variable| {
                sinks
                    .iter()
                    .any(|sink| sink.as_any().eq(variable).unwrap_or(false))
            }) && self.sink(&contents)
            {
                // Only written to by the code (a list a test counts calls in): no read. A
                // container stays the one it was, or the code is read again; a number the code
                // rebinds (`nonlocal n; n += 1`) is not watched.
                if !unchangeable(&contents) {
                    let held = Binding::Cell {
                        index,
                        expected: Some(Held::of(&contents)),
                    };
                    self.bind(function, held, None);
                }
                items.push(Item::Mark(b'S'));
                continue;
            }
            let name = match variable {
                Some(name) => PlaceName::Cell(name),
                None => PlaceName::Static("<cell>"),
            };
            let here = place(at, ".", name);
            items.push(Item::Mark(b'L'));
            items.push(read_by(
                function,
                names,
                contents,
                here,
                Read::Cell(index),
                true,
            ));
        }
        Ok(())
    }

    /// Appends to `items` what each global of `read` is in `function`'s module (a builtin is
    /// recorded to stay unshadowed, a name not defined yet to stay undefined, a global the code
    /// only writes to as such), and each module it imports in its body.
    fn globals(
        &mut self,
        function: &Bound<'py, PyAny>,
        at: &Rc<Place<'py>>,
        names: &Names<'py>,
        read: &Reads<'py>,
        items: &mut Vec<Item<'py>>,
    ) -> PyResult<()> {
        let py = self.py;
        let namespace = function
            .getattr(intern!(py, "__globals__"))?
            .cast_into::<PyDict>()?;
        let module = namespace.get_item(intern!(py, "__name__"))?;
        // Read as it is, never through `str()`: that checks for Ctrl-C, and pyo3's `Display`
        // would report an interrupt met there as unraisable, and lose it.
        let module: Rc<str> = module
            .and_then(|name| name.cast_into::<PyString>().ok())
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default()
            .into();
        let modules = self.kinds.modules.bind(py);
        let mut found_items = Vec::new();
        for name in &read.globals {
            let Some(found) = namespace.get_item(name)? else {
                // A builtin, which a global of its name would shadow, or a name not defined
                // yet (read under `try: ... except NameError`): either must stay undefined.
                let missing = Binding::GlobalMissing {
                    name: name.clone().into_any().unbind(),
                };
                self.bind(function, missing, None);
                continue;
            };
            let only_written = read.sinks.iter().any(|sink| sink.is(name));
            if only_written && self.sink(&found) {
                // The code writes to it and never reads it (a log appended to, a counter):
                // not what the output is computed from.
                if !unchangeable(&found) {
                    let held = Binding::Global {
                        name: name.clone().into_any().unbind(),
                        expected: Held::of(&found),
                    };
                    self.bind(function, held, None);
                }
                found_items.push((Item::Named(b'S', name.clone()), None));
                continue;
            }
            let global = PlaceName::Global(Rc::clone(&module), name.clone());
            let here = place(at, " > ", global);
            let by = Read::Global(name.clone());
            found_items.push((
                Item::Named(b'G', name.clone()),
                Some(read_by(function, names, found, here, by, true)),
            ));
        }
        for (name, level) in &read.imports {
            let Some(absolute) = self.absolute(&namespace, name, *level)? else {
                continue;
            };
            let found = match modules.get_item(&absolute)? {
                Some(found) => Some(found),
                // Not imported yet in this process (a hit never calls the node that would):
                // imported now if it is the user's, so that its code is in the key.
                None => Some(self.load.call1((&absolute,))?).filter(|found| !found.is_none()),
            };
            if let Some(found) = found {
                // Imported inside the function (`import helpers`, `from .helpers import
                // scale` in its body).
                let here = place(at, " > ", PlaceName::Name(absolute.clone()));
                let by = Read::Item(absolute.clone());
                found_items.push((
                    Item::Named(b'I', absolute.clone()),
                    Some(read_by(modules.as_any(), names, found, here, by, true)),
                ));
            }
        }
        items.push(Item::Count(found_items.len()));
        for (tag, entry) in found_items {
            items.push(tag);
            items.extend(entry);
        }
        Ok(())
    }

    /// The absolute name of the module an import of `name` at `level` in a function of the
    /// module whose globals are `namespace` imports (`from ..helpers import x` in `pkg.sub.m`
    /// is `pkg.helpers`); `None` where the level climbs past the top package.
    fn absolute(
        &self,
        namespace: &Bound<'py, PyDict>,
        name: &Bound<'py, PyString>,
        level: u32,
    ) -> PyResult<Option<Bound<'py, PyString>>> {
        if level == 0 {
            return Ok(Some(name.clone()));
        }
        let text = |found: Option<Bound<'py, PyAny>>| {
            found
                .and_then(|found| found.cast_into::<PyString>().ok())
                .map(|found| found.to_string_lossy().into_owned())
        };
        // As the import system reads it: `__package__`, or else the module's own name when it
        // is a package, its parent's when not.
        let package = match text(namespace.get_item(intern!(self.py, "__package__"))?) {
            Some(package) if !package.is_empty() => package,
            _ => {
                let Some(module) = text(namespace.get_item(intern!(self.py, "__name__"))?) else {
                    return Ok(None);
                };
                if namespace.contains(intern!(self.py, "__path__"))? {
                    module
                } else {
                    module
                        .rsplit_once('.')
                        .map(|(parent, _)| parent.to_owned())
                        .unwrap_or_default()
                }
            }
        };
        let mut parts: Vec<&str> = package.split('.').filter(|part| !part.is_empty()).collect();
        let up = (level - 1) as usize;
        if parts.len() <= up {
            return Ok(None); // Past the top package: the import itself fails.
        }
        parts.truncate(parts.len() - up);
        let own = name.to_string_lossy();
        if !own.is_empty() {
            parts.push(&own);
        }
        Ok(Some(PyString::new(self.py, &parts.join("."))))
    }

    /// Whether `found`, which the code only writes to, may be left out of the key: a number
    /// the code rebinds, or a list, dict, set or deque, whose mutators answer nothing.
    fn sink(&self, found: &Bound<'py, PyAny>) -> bool {
        let kind = found.get_type();
        unchangeable(found) || self.kinds.sinks.iter().any(|sink| kind.is(sink))
    }

    fn class(&mut self, cls: &Bound<'py, PyType>, at: &Rc<Place<'py>>) -> PyResult<()> {
        let py = self.py;
        let object = cls.as_any();
        self.out.push(b'K');
        feed_own_name(&mut self.out, object)?;
        let bases = object.getattr(intern!(py, "__bases__"))?;
        let fixed = Binding::Attribute {
            name: intern!(py, "__bases__").clone().unbind(),
            expected: Held::of(&bases),
        };
        self.bind(object, fixed, None);
        let nothing: Names<'py> = Rc::new(Vec::new());
        let unbound = |object: Bound<'py, PyAny>, place| {
            Item::Visit(Visit {
                object,
                place,
                names: Rc::clone(&nothing),
                owner: None,
                read: None,
                always: false,
            })
        };
        let mut items: Vec<Item<'py>> = Vec::with_capacity(32);
        let meta = place(at, ".", PlaceName::Static("__class__"));
        items.push(unbound(cls.get_type().into_any(), meta));
        let bases = bases.cast_into::<PyTuple>()?;
        items.push(Item::Count(bases.len()));
        for base in bases.iter() {
            let named = place(at, " > ", PlaceName::Text(qualified(&base)?));
            items.push(unbound(base, named));
        }
        let attributes = object
            .getattr(intern!(py, "__dict__"))?
            .call_method0(intern!(py, "items"))?;
        let own = object.getattr(intern!(py, "__dict__"))?.len()?;
        self.bind(object, Binding::VarsLen { len: own }, None);
        let mut kept = Vec::new();
        let mut annotations = None;
        for entry in attributes.try_iter()? {
            let (name, attribute): (Bound<'py, PyString>, Bound<'py, PyAny>) = entry?.extract()?;
            if name.to_str()? == "__annotations__" {
                annotations = Some((name, attribute));
                continue;
            }
            // `_soma_` names are Soma's own bookkeeping (a function node's blueprint, whose
            // function is its `forward` already), as a node's own `_soma_` attributes are.
            let skipped = CLASS_SKIP.contains(&name.to_str()?)
                || name.to_str()?.starts_with("_soma_")
                || self
                    .kinds
                    .descriptors
                    .iter()
                    .any(|descriptor| attribute.get_type().is(descriptor));
            if !skipped {
                kept.push((name, attribute));
            }
        }
        // By name: the order a class's attributes were set in is the order of the statements
        // that made it, which a class pickled by value and made again elsewhere does not keep.
        let mut sorted = Vec::with_capacity(kept.len());
        for (name, attribute) in kept {
            sorted.push((name.to_str()?.to_owned(), name, attribute));
        }
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let kept: Vec<_> = sorted
            .into_iter()
            .map(|(_, name, attribute)| (name, attribute))
            .collect();
        items.push(Item::Count(kept.len()));
        for (name, attribute) in kept {
            items.push(Item::Named(b'.', name.clone()));
            items.push(Item::Visit(Visit {
                object: attribute,
                place: place(at, ".", PlaceName::Name(name.clone())),
                names: Rc::clone(&nothing),
                owner: Some(object.clone()),
                read: Some(Read::Vars(name)),
                always: true,
            }));
        }
        // Its annotations, which `typing.get_type_hints` hands to code that reads them: as
        // they read now, the dict watched for a rebinding (a class made again), not digested
        // again on every run as a dict would be.
        match annotations {
            Some((name, found)) => {
                let held = Binding::Vars {
                    name: name.into_any().unbind(),
                    expected: Held::of(&found),
                };
                self.bind(object, held, None);
                items.push(Item::Mark(b'A'));
                match found.cast::<PyDict>() {
                    Ok(found) => {
                        items.push(Item::Count(found.len()));
                        for (key, value) in found.iter() {
                            items.push(Item::Named(b'.', key.str()?));
                            self.annotation(&value, 0, &mut items)?;
                        }
                    }
                    Err(_) => self.annotation(&found, 0, &mut items)?,
                }
            }
            None => items.push(Item::Mark(b'-')),
        }
        self.pending.extend(items.into_iter().rev());
        Ok(())
    }

    /// Appends to `items` an annotation: a string or a constant as it is, a class as code (the
    /// user's followed, a library's by name), a generic (`list[Point]`) by its origin and
    /// arguments, anything else by its `repr`.
    fn annotation(
        &self,
        value: &Bound<'py, PyAny>,
        depth: usize,
        items: &mut Vec<Item<'py>>,
    ) -> PyResult<()> {
        let py = self.py;
        let unbound = |object: Bound<'py, PyAny>| {
            Item::Visit(Visit {
                object,
                place: Rc::new(Place {
                    parent: None,
                    join: "",
                    name: PlaceName::Static("__annotations__"),
                }),
                names: Rc::new(Vec::new()),
                owner: None,
                read: None,
                always: false,
            })
        };
        if value.is_instance_of::<PyType>() || unchangeable(value) {
            items.push(unbound(value.clone()));
            return Ok(());
        }
        let origin = value.getattr_opt(intern!(py, "__origin__"))?;
        let arguments = value.getattr_opt(intern!(py, "__args__"))?;
        if let (Some(origin), Some(arguments), true) = (origin, arguments, depth < 32) {
            if let Ok(arguments) = arguments.cast::<PyTuple>() {
                items.push(Item::Mark(b'g'));
                self.annotation(&origin, depth + 1, items)?;
                items.push(Item::Count(arguments.len()));
                for argument in arguments.iter() {
                    self.annotation(&argument, depth + 1, items)?;
                }
                return Ok(());
            }
        }
        items.push(Item::Named(b'r', value.repr()?));
        Ok(())
    }

    fn module(
        &mut self,
        module: &Bound<'py, PyAny>,
        names: &Names<'py>,
        at: &Rc<Place<'py>>,
    ) -> PyResult<()> {
        let name = module
            .getattr(intern!(self.py, "__name__"))?
            .cast_into::<PyString>()?;
        if !self.users(module)? {
            text(&mut self.out, b'o', name_bytes(&name)?);
            return Ok(());
        }
        let along = (module.as_ptr() as usize, Rc::as_ptr(names) as usize);
        if !self.modules.insert(along) {
            // Met again along the same names: what it holds is in the digest already.
            text(&mut self.out, b'u', name_bytes(&name)?);
            return Ok(());
        }
        self.held.push(module.clone());
        let attributes = module.cast::<PyModule>()?.dict();
        let mut found = Vec::new();
        let mut missing = false;
        for attribute in names.iter() {
            if let Some(value) = attributes.get_item(attribute)? {
                found.push((attribute.clone(), value));
            } else {
                missing = true;
            }
        }
        let getter = intern!(self.py, "__getattr__");
        if missing {
            if let Some(value) = attributes.get_item(getter)? {
                // A name the code reads that a module `__getattr__` (PEP 562) serves: that
                // function is followed, and what it reads with it (the dict behind it, digested
                // on every run); and a name defined in the module since, which adds to its
                // namespace, has the code read again. (Without one, reading a name the module
                // does not define raises: no answer is kept.)
                if !found.iter().any(|(attribute, _)| attribute.is(getter)) {
                    found.push((getter.clone(), value));
                }
                let len = attributes.len();
                self.bind(module, Binding::VarsLen { len }, None);
            }
        }
        text(&mut self.out, b'O', name_bytes(&name)?);
        length(&mut self.out, found.len());
        let mut items = Vec::with_capacity(2 * found.len());
        for (attribute, value) in found {
            items.push(Item::Named(b'.', attribute.clone()));
            // Its attributes that this code names, followed with the same names.
            items.push(Item::Visit(Visit {
                object: value,
                place: place(at, ".", PlaceName::Name(attribute.clone())),
                names: Rc::clone(names),
                owner: Some(module.clone()),
                read: Some(Read::Vars(attribute)),
                always: true,
            }));
        }
        self.pending.extend(items.into_iter().rev());
        Ok(())
    }
}

/// The digest of what the class or function `root` reaches, the witness of the bindings it was
/// read from, and where each volatile binding lies (in the order `Witness.current()` hands
/// their objects back).
///
/// `files` remembers, by file name, whether code compiled from it is the user's, and
/// `users_file(name)` decides it for a name not there yet (and remembers it); `users(object)`
/// decides for a module without a file or a class whose module is not registered; `load(name)`
/// imports a module of the user's that code imports in its body and no one imported yet.
///
/// # Errors
/// Whatever reading an attribute raised, and `TypeError` for a root that is neither a class
/// nor a function.
#[pyfunction]
pub fn reach<'py>(
    root: &Bound<'py, PyAny>,
    files: &Bound<'py, PyDict>,
    users_file: &Bound<'py, PyAny>,
    users: &Bound<'py, PyAny>,
    load: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyBytes>, Witness, Vec<String>)> {
    let py = root.py();
    if !root.is_instance_of::<PyFunction>() && !root.is_instance_of::<PyType>() {
        return Err(PyTypeError::new_err(
            "reach follows a class or a function of the user's",
        ));
    }
    let mut walk = CodeWalk {
        py,
        kinds: kinds(py)?,
        users: users.clone(),
        files: files.clone(),
        users_file: users_file.clone(),
        load: load.clone(),
        out: Vec::with_capacity(2048),
        owners: Vec::new(),
        owner_at: ByAddressMap::default(),
        seen: ByAddressMap::default(),
        held: Vec::new(),
        modules: ByAddressSet::default(),
        pending: Vec::new(),
    };
    walk.pending.push(Item::Visit(Visit {
        object: root.clone(),
        place: Rc::new(Place {
            parent: None,
            join: "",
            name: PlaceName::Text(qualified(root)?),
        }),
        names: Rc::new(Vec::new()),
        owner: None,
        read: None,
        always: false,
    }));
    while let Some(item) = walk.pending.pop() {
        match item {
            Item::Mark(mark) => walk.out.push(mark),
            Item::Count(count) => length(&mut walk.out, count),
            Item::Named(mark, name) => text(&mut walk.out, mark, name_bytes(&name)?),
            Item::Visit(visit) => walk.visit(visit)?,
        }
    }
    let digest = *blake3::hash(&walk.out).as_bytes();
    // The witness hands volatile objects back owner by owner: their places in that order.
    let mut places = Vec::new();
    let owners = walk
        .owners
        .into_iter()
        .map(|(owner, bindings, volatile)| {
            places.extend(volatile);
            Owner {
                owner: Held::of(&owner),
                bindings,
            }
        })
        .collect();
    Ok((
        PyBytes::new(py, &digest),
        Witness {
            parts: Vec::new(),
            owners,
        },
        places,
    ))
}
