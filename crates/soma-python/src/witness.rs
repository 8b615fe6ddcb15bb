//! `soma._soma.Witness`: what a remembered digest was made from, checked by identity.
//!
//! A node's fingerprint reads its class, the functions and classes its code reaches by name,
//! the module-level names they read and the node's own attributes (`soma/cache/_fingerprint.py`).
//! Reading them all again on every run would cost tens of microseconds a node; a witness,
//! taken when they were read, says in well under a microsecond whether each binding still holds
//! the very object it held then (`is`, never `==`): a module's global, a class's attribute, a
//! function's code, defaults and closure cells, a node's attribute. A binding rebound — a module
//! reloaded, a function's `__code__` patched in place by an autoreloader, `node.f = other` —
//! fails the check, and the digest is made again.
//!
//! A witness checks identities only: what a bound object holds where it can change in place (a
//! list, an array) is not its business. Such bindings are marked *volatile*: `current()` hands
//! their objects back, and the fingerprint digests them again on every run.
//!
//! Objects are held weakly wherever Python allows it (functions, classes, modules, nodes), so a
//! witness kept for a class never keeps that class alive, nor the old function a rebinding
//! replaced; a dead one fails its check. What cannot be referenced weakly (an int, a tuple, a
//! dict) is held, so that no other object can take its place, and its `id`, unseen.

use std::cell::OnceCell;

use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{
    PyBytes, PyDict, PyFunction, PyModule, PyString, PyTuple, PyType, PyWeakrefReference,
};

/// The function and cell fields a witness reads, declared here because the limited API the abi3
/// wheel is built against leaves them out of `pyo3::ffi` (as `context.rs` declares the context
/// calls). Every `CPython` from 3.7 on exports each with this signature
/// (`Include/cpython/funcobject.h`, `cellobject.h`), 3.14's too; an interpreter that lacked one
/// would refuse to import the module (an undefined symbol), never run it wrongly.
mod function_c {
    use pyo3::ffi::PyObject;

    extern "C" {
        pub(super) fn PyFunction_GetGlobals(function: *mut PyObject) -> *mut PyObject;
        pub(super) fn PyFunction_GetCode(function: *mut PyObject) -> *mut PyObject;
        pub(super) fn PyFunction_GetDefaults(function: *mut PyObject) -> *mut PyObject;
        pub(super) fn PyFunction_GetKwDefaults(function: *mut PyObject) -> *mut PyObject;
        pub(super) fn PyFunction_GetClosure(function: *mut PyObject) -> *mut PyObject;
        pub(super) fn PyCell_Get(cell: *mut PyObject) -> *mut PyObject;
    }
}

/// `result`'s value, `None` for an ordinary exception (which is dropped: the binding read no
/// longer holds); a `BaseException` that is no `Exception` — Ctrl-C's `KeyboardInterrupt`,
/// `SystemExit` — is no answer to drop, and is raised on, or Ctrl-C would be lost in a check.
pub(crate) fn unless_interrupted<T>(py: Python<'_>, result: PyResult<T>) -> PyResult<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.is_instance_of::<PyException>(py) => Ok(None),
        Err(error) => Err(error),
    }
}

/// An object a witness refers to: weakly where Python allows it.
pub(crate) enum Held {
    Weak(Py<PyWeakrefReference>),
    Strong(Py<PyAny>),
}

impl Held {
    pub(crate) fn of(object: &Bound<'_, PyAny>) -> Self {
        // Asked of the type first (its `__weakrefoffset__`, what `PyType_SUPPORTS_WEAKREFS`
        // reads, which the stable ABI has no macro for): a refused weak reference raises, which
        // costs a microsecond. Any offset but 0 says yes: from 3.12 on a class of the user's
        // keeps its weak references at a negative one (managed by the interpreter), which a
        // test of `> 0` took for none, holding every node strongly.
        let py = object.py();
        let weakly = object
            .get_type()
            .getattr(pyo3::intern!(py, "__weakrefoffset__"))
            .and_then(|offset| offset.extract::<isize>())
            .is_ok_and(|offset| offset != 0);
        if weakly {
            if let Ok(weak) = PyWeakrefReference::new(object) {
                return Held::Weak(weak.unbind());
            }
        }
        Held::Strong(object.clone().unbind())
    }

    /// The object, while it lives.
    #[inline]
    fn get<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        match self {
            Held::Weak(weak) => weak.bind(py).upgrade(),
            Held::Strong(strong) => Some(strong.bind(py).clone()),
        }
    }

    /// Whether `found` is this object.
    #[inline]
    fn is(&self, py: Python<'_>, found: &Bound<'_, PyAny>) -> bool {
        self.get(py).is_some_and(|held| held.is(found))
    }

    fn traverse(&self, visit: &pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        match self {
            Held::Weak(weak) => visit.call(weak),
            Held::Strong(strong) => visit.call(strong),
        }
    }
}

/// What one binding of an owner must still hold.
pub(crate) enum Binding {
    /// `getattr(owner, name)` is `expected`.
    Attribute { name: Py<PyString>, expected: Held },
    /// The owner's own namespace — a class's or a module's `__dict__`, an instance's — maps
    /// `name` to `expected`.
    Vars { name: Py<PyAny>, expected: Held },
    /// The owner's namespace has `len` entries: nothing was added to it.
    VarsLen { len: usize },
    /// The owner, a function, reads `name` from its module's globals, where it is `expected`.
    Global { name: Py<PyAny>, expected: Held },
    /// The owner, a function, reads `name` from builtins, which a global of that name would
    /// shadow: it must stay absent from its globals.
    GlobalMissing { name: Py<PyAny> },
    /// The owner, a function, has this code, defaults and keyword defaults.
    Function {
        code: Held,
        defaults: Held,
        kwdefaults: Held,
    },
    /// The owner, a function, holds `expected` in its closure cell `index`, or nothing.
    Cell {
        index: usize,
        expected: Option<Held>,
    },
    /// `type(owner)` is `expected`.
    Type { expected: Held },
    /// `owner[key]` is `expected` (the owner a mapping: `sys.modules`).
    Item { key: Py<PyAny>, expected: Held },
}

/// An owner and the bindings it must still hold, each with whether its object is volatile.
pub(crate) struct Owner {
    pub(crate) owner: Held,
    pub(crate) bindings: Vec<(Binding, bool)>,
}

/// What a remembered digest was made from: bindings that must still hold the objects they held.
#[pyclass(module = "soma._soma", frozen)]
pub struct Witness {
    pub(crate) parts: Vec<Py<Witness>>,
    pub(crate) owners: Vec<Owner>,
}

/// The kinds of binding, as `soma.cache._fingerprint` writes them: the first item of each tuple.
const ATTRIBUTE: u8 = 0;
const VARS: u8 = 1;
const VARS_LEN: u8 = 2;
const GLOBAL: u8 = 3;
const GLOBAL_MISSING: u8 = 4;
const FUNCTION: u8 = 5;
const CELL: u8 = 6;
const EMPTY_CELL: u8 = 7;
const TYPE: u8 = 8;
const ITEM: u8 = 9;

/// A borrowed reference from the C API as a bound object, `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or a borrowed reference that stays valid while the caller holds the object
/// that lent it, with the GIL held.
#[allow(unsafe_code)]
unsafe fn borrowed(py: Python<'_>, ptr: *mut ffi::PyObject) -> Option<Bound<'_, PyAny>> {
    // SAFETY: as the caller promises.
    unsafe { Bound::from_borrowed_ptr_or_opt(py, ptr) }
}

/// The namespace of `owner`: a class's own `__dict__` (through its read-only proxy: the stable
/// ABI does not reach the dict in place), a module's, a function's, an instance's.
fn namespace<'py>(owner: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let py = owner.py();
    if owner.is_instance_of::<PyType>() {
        return owner.getattr(pyo3::intern!(py, "__dict__")).ok();
    }
    if owner.is_instance_of::<PyModule>() {
        // SAFETY: a module's dict, borrowed from the module the caller holds.
        #[allow(unsafe_code)]
        let dict = unsafe { borrowed(py, ffi::PyModule_GetDict(owner.as_ptr())) };
        return dict;
    }
    if owner.is_instance_of::<PyFunction>() {
        // A function's `__dict__` is the generic one, which no subclass can override (a
        // function's type cannot be subclassed): read in place, not looked up by name, as
        // every function a node reaches is checked on every rerun.
        // SAFETY: `owner` is a function the caller holds; the call answers a new reference to
        // its dict (made empty on first read), or NULL with an error set, cleared below.
        #[allow(unsafe_code)]
        let dict = unsafe {
            Bound::from_owned_ptr_or_opt(
                py,
                ffi::PyObject_GenericGetDict(owner.as_ptr(), std::ptr::null_mut()),
            )
        };
        if dict.is_none() {
            drop(PyErr::take(py));
        }
        return dict;
    }
    owner.getattr(pyo3::intern!(py, "__dict__")).ok()
}

/// What a binding reads now: `Ok(None)` when it no longer holds what it held, an error only
/// for an interrupt met while reading it.
type Current<'py> = PyResult<Option<Bound<'py, PyAny>>>;

/// `dict[name]`, `None` when missing (or when looking it up raised, which is cleared).
#[inline]
fn entry<'py>(namespace: &Bound<'py, PyAny>, name: &Py<PyAny>) -> Option<Bound<'py, PyAny>> {
    match namespace.cast::<PyDict>() {
        Ok(dict) => dict.get_item(name).ok().flatten(),
        // A class's proxy: a missing name is a `KeyError`, which is an answer here.
        Err(_) => namespace.get_item(name).ok(),
    }
}

/// A function's field read through the C API: its code, globals, defaults, closure.
#[inline]
fn field<'py>(
    function: &Bound<'py, PyAny>,
    read: unsafe extern "C" fn(*mut ffi::PyObject) -> *mut ffi::PyObject,
) -> Option<Bound<'py, PyAny>> {
    if !function.is_instance_of::<PyFunction>() {
        return None;
    }
    // SAFETY: `function` is a function object the caller holds; each `PyFunction_Get*` lends a
    // reference owned by it (NULL for a field that is not set), with the GIL held.
    #[allow(unsafe_code)]
    unsafe {
        borrowed(function.py(), read(function.as_ptr()))
    }
}

/// `None`, the object Python says a missing default or keyword default is.
fn or_none<'py>(py: Python<'py>, found: Option<Bound<'py, PyAny>>) -> Bound<'py, PyAny> {
    found.unwrap_or_else(|| py.None().into_bound(py))
}

/// An owner being checked, with its namespace and its globals each read once for all of its
/// bindings: a class's namespace is a proxy made at each read, and a class may have dozens of
/// bindings, each checked on every rerun.
struct Checked<'py> {
    owner: Bound<'py, PyAny>,
    namespace: OnceCell<Option<Bound<'py, PyAny>>>,
    globals: OnceCell<Option<Bound<'py, PyAny>>>,
}

impl<'py> Checked<'py> {
    #[inline]
    fn new(owner: Bound<'py, PyAny>) -> Self {
        Checked {
            owner,
            namespace: OnceCell::new(),
            globals: OnceCell::new(),
        }
    }

    #[inline]
    fn namespace(&self) -> Option<&Bound<'py, PyAny>> {
        self.namespace
            .get_or_init(|| namespace(&self.owner))
            .as_ref()
    }

    #[inline]
    fn globals(&self) -> Option<&Bound<'py, PyAny>> {
        self.globals
            .get_or_init(|| field(&self.owner, function_c::PyFunction_GetGlobals))
            .as_ref()
    }
}

impl Binding {
    /// The object the binding holds now, if it still holds the one it held; an error only for
    /// an interrupt met while reading it (see [`unless_interrupted`]).
    // Inlined into `Witness::collect`, its one caller, whatever the compiler's partitioning of
    // the crate: left to it, a change elsewhere in the crate made every binding checked on a
    // rerun's hit ~8% slower (`benches/python/cache.py`, "unchanged since the last run").
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn current<'py>(&self, checked: &Checked<'py>) -> Current<'py> {
        let owner = &checked.owner;
        let py = owner.py();
        let kept =
            |found: Bound<'py, PyAny>, expected: &Held| expected.is(py, &found).then_some(found);
        Ok(match self {
            Binding::Attribute { name, expected } => {
                // The one read that may run Python code (a property, `__getattr__`).
                unless_interrupted(py, owner.getattr(name))?.and_then(|found| kept(found, expected))
            }
            Binding::Vars { name, expected } => checked
                .namespace()
                .and_then(|namespace| entry(namespace, name))
                .and_then(|found| kept(found, expected)),
            Binding::VarsLen { len } => checked
                .namespace()
                .filter(|namespace| namespace.len().is_ok_and(|found| found == *len))
                .map(|_| owner.clone()),
            Binding::Global { name, expected } => checked
                .globals()
                .and_then(|globals| entry(globals, name))
                .and_then(|found| kept(found, expected)),
            Binding::GlobalMissing { name } => checked
                .globals()
                .filter(|globals| entry(globals, name).is_none())
                .map(|_| owner.clone()),
            Binding::Function {
                code,
                defaults,
                kwdefaults,
            } => field(owner, function_c::PyFunction_GetCode).and_then(|code_now| {
                let defaults_now = or_none(py, field(owner, function_c::PyFunction_GetDefaults));
                let kwdefaults_now =
                    or_none(py, field(owner, function_c::PyFunction_GetKwDefaults));
                (code.is(py, &code_now)
                    && defaults.is(py, &defaults_now)
                    && kwdefaults.is(py, &kwdefaults_now))
                .then(|| owner.clone())
            }),
            Binding::Cell { index, expected } => {
                let Some(closure) = field(owner, function_c::PyFunction_GetClosure) else {
                    return Ok(None);
                };
                let Some(cell) = closure
                    .cast::<PyTuple>()
                    .ok()
                    .and_then(|cells| cells.get_item(*index).ok())
                else {
                    return Ok(None);
                };
                // SAFETY: `cell` is an item of the function's closure, held here; `PyCell_Get`
                // answers a new reference, or NULL for an empty cell (an error set, cleared
                // below, if it is not a cell at all).
                #[allow(unsafe_code)]
                let contents = unsafe {
                    Bound::from_owned_ptr_or_opt(py, function_c::PyCell_Get(cell.as_ptr()))
                };
                if contents.is_none() && PyErr::take(py).is_some() {
                    return Ok(None);
                }
                match (contents, expected) {
                    (Some(contents), Some(expected)) => kept(contents, expected),
                    (None, None) => Some(owner.clone()),
                    (Some(_), None) | (None, Some(_)) => None,
                }
            }
            Binding::Type { expected } => kept(owner.get_type().into_any(), expected),
            // `sys.modules`, a dict keyed by text: no Python code runs in the lookup.
            Binding::Item { key, expected } => owner
                .get_item(key)
                .ok()
                .and_then(|found| kept(found, expected)),
        })
    }

    fn traverse(&self, visit: &pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        match self {
            Binding::Attribute { name, expected } => {
                visit.call(name)?;
                expected.traverse(visit)
            }
            Binding::Vars { name, expected } | Binding::Global { name, expected } => {
                visit.call(name)?;
                expected.traverse(visit)
            }
            Binding::Item { key, expected } => {
                visit.call(key)?;
                expected.traverse(visit)
            }
            Binding::GlobalMissing { name } => visit.call(name),
            Binding::VarsLen { len: _ } => Ok(()),
            Binding::Function {
                code,
                defaults,
                kwdefaults,
            } => {
                code.traverse(visit)?;
                defaults.traverse(visit)?;
                kwdefaults.traverse(visit)
            }
            Binding::Cell { index: _, expected } => match expected {
                Some(expected) => expected.traverse(visit),
                None => Ok(()),
            },
            Binding::Type { expected } => expected.traverse(visit),
        }
    }
}

/// A binding from the tuple `soma.cache._fingerprint` wrote: `(kind, key, expected)`, its tail as
/// its kind needs.
fn binding_of(binding: &Bound<'_, PyTuple>) -> PyResult<Binding> {
    let kind: u8 = binding.get_item(0)?.extract()?;
    let item = |i: usize| binding.get_item(i);
    let name = || item(1).map(Bound::unbind);
    let expected = |i: usize| item(i).map(|found| Held::of(&found));
    Ok(match kind {
        ATTRIBUTE => Binding::Attribute {
            name: item(1)?.cast_into::<PyString>()?.unbind(),
            expected: expected(2)?,
        },
        VARS => Binding::Vars {
            name: name()?,
            expected: expected(2)?,
        },
        VARS_LEN => Binding::VarsLen {
            len: item(1)?.extract()?,
        },
        GLOBAL => Binding::Global {
            name: name()?,
            expected: expected(2)?,
        },
        GLOBAL_MISSING => Binding::GlobalMissing { name: name()? },
        FUNCTION => Binding::Function {
            code: expected(1)?,
            defaults: expected(2)?,
            kwdefaults: expected(3)?,
        },
        CELL => Binding::Cell {
            index: item(1)?.extract()?,
            expected: Some(expected(2)?),
        },
        EMPTY_CELL => Binding::Cell {
            index: item(1)?.extract()?,
            expected: None,
        },
        TYPE => Binding::Type {
            expected: expected(1)?,
        },
        ITEM => Binding::Item {
            key: name()?,
            expected: expected(2)?,
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "a witness binding of unknown kind {other}"
            )))
        }
    })
}

impl Witness {
    /// Appends the objects of the volatile bindings to `out`, parts first; `false` when a
    /// binding no longer holds what it held; an error only for an interrupt met in a check.
    fn collect<'py>(&self, py: Python<'py>, out: &mut Vec<Bound<'py, PyAny>>) -> PyResult<bool> {
        for part in &self.parts {
            if !part.get().collect(py, out)? {
                return Ok(false);
            }
        }
        for owner in &self.owners {
            let Some(object) = owner.owner.get(py) else {
                return Ok(false);
            };
            let checked = Checked::new(object);
            for (binding, volatile) in &owner.bindings {
                let Some(found) = binding.current(&checked)? else {
                    return Ok(false);
                };
                if *volatile {
                    out.push(found);
                }
            }
        }
        Ok(true)
    }
}

#[pymethods]
impl Witness {
    /// A witness of `owners`, each `(owner, bindings)` with bindings `(kind, ...)` tuples and a
    /// last item saying whether the binding's object is volatile, and of the witnesses `parts`.
    #[new]
    #[pyo3(signature = (owners, parts = Vec::new()))]
    fn new(owners: &Bound<'_, PyAny>, parts: Vec<Py<Witness>>) -> PyResult<Self> {
        let owners = owners
            .try_iter()?
            .map(|entry| {
                let entry = entry?;
                let (owner, bindings): (Bound<'_, PyAny>, Bound<'_, PyAny>) = entry
                    .extract()
                    .map_err(|_| PyTypeError::new_err("a witness owner is (owner, bindings)"))?;
                let bindings = bindings
                    .try_iter()?
                    .map(|binding| {
                        let binding = binding?;
                        let tuple = binding
                            .cast::<PyTuple>()
                            .map_err(|_| PyTypeError::new_err("a witness binding is a tuple"))?;
                        let last = tuple.len().checked_sub(1).ok_or_else(|| {
                            PyValueError::new_err("a witness binding is not empty")
                        })?;
                        let volatile: bool = tuple.get_item(last)?.extract()?;
                        Ok((binding_of(&tuple.get_slice(0, last))?, volatile))
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(Owner {
                    owner: Held::of(&owner),
                    bindings,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Witness { parts, owners })
    }

    /// The objects the volatile bindings hold now, parts first, when every binding still holds
    /// the object it held when the witness was taken; `None` when one does not.
    fn current<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let mut out = Vec::new();
        if !self.collect(py, &mut out)? {
            return Ok(None);
        }
        PyTuple::new(py, out).map(Some)
    }

    /// How many bindings it checks, its parts' included.
    fn __len__(&self) -> usize {
        let own: usize = self.owners.iter().map(|owner| owner.bindings.len()).sum();
        own + self
            .parts
            .iter()
            .map(|part| part.get().__len__())
            .sum::<usize>()
    }

    fn __traverse__(&self, visit: pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        for part in &self.parts {
            visit.call(part)?;
        }
        for owner in &self.owners {
            owner.owner.traverse(&visit)?;
            for (binding, _) in &owner.bindings {
                binding.traverse(&visit)?;
            }
        }
        Ok(())
    }
}

/// A node's fingerprint as remembered: the node (weakly), the digest of what cannot change in
/// place, the witness of what it was read from, and where its volatile bindings lie. Made by
/// `soma.cache._fingerprint`; read there and, for a rerun's hit, by the run cache here
/// ([`Remembered::unchanged`]), without a Python frame.
#[pyclass(module = "soma._soma", frozen)]
pub struct Remembered {
    #[pyo3(get)]
    node: Py<PyWeakrefReference>,
    #[pyo3(get)]
    stable: Py<PyBytes>,
    #[pyo3(get)]
    witness: Py<Witness>,
    #[pyo3(get)]
    wheres: Py<PyTuple>,
}

#[pymethods]
impl Remembered {
    #[new]
    fn new(
        node: Py<PyWeakrefReference>,
        stable: Py<PyBytes>,
        witness: Py<Witness>,
        wheres: Py<PyTuple>,
    ) -> Self {
        Remembered {
            node,
            stable,
            witness,
            wheres,
        }
    }

    fn __traverse__(&self, visit: pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.node)?;
        visit.call(&self.stable)?;
        visit.call(&self.witness)?;
        visit.call(&self.wheres)
    }
}

impl Remembered {
    /// The fingerprint, when this is `node`'s and nothing it was read from was rebound, and
    /// nothing volatile needs digesting again; `None` otherwise (Python then makes it).
    pub(crate) fn unchanged(
        &self,
        py: Python<'_>,
        node: &Bound<'_, PyAny>,
    ) -> PyResult<Option<[u8; 32]>> {
        if !self
            .node
            .bind(py)
            .upgrade()
            .is_some_and(|held| held.is(node))
        {
            return Ok(None);
        }
        let mut volatile = Vec::new();
        if !self.witness.get().collect(py, &mut volatile)? || !volatile.is_empty() {
            return Ok(None);
        }
        Ok(<[u8; 32]>::try_from(self.stable.bind(py).as_bytes()).ok())
    }
}
