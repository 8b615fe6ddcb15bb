//! `soma._soma.code_digest`: the digest of a Python code object, for the keys of `soma.Cache`.
//!
//! A node's key covers the code it runs (`soma/cache/_fingerprint.py`): each function by its
//! compiled code, which is what it does — instructions, the names and constants they use
//! (nested functions, lambdas and comprehensions included), its arguments, flags and exception
//! table — and not where it was written: the file name and line numbers are left out, so a
//! function moved down a file, or a comment edited above it, keeps its digest. Read here rather
//! than in Python because a fingerprint reads a dozen functions the first time a node is keyed,
//! and the encoding below is a few microseconds of Python each.
//!
//! The encoding is prefix-free (a tag per constant's kind, every length before what it counts)
//! and reads nothing that differs between processes: a frozenset constant (`x in {"a", "b"}`)
//! is fed in the order of its members' digests, not in its hash order.
//!
//! [`reads_of`] says which names a code object looks up as globals, as attributes and as
//! imports, from its instructions: what a key follows from a function (`crate::reach`). Read
//! from the bytecode, not from `co_names` (which mixes globals and attribute names), so that
//! `self.model` does not make a key read a module-level `model` it never uses. It also tells a
//! store from a read: a global or a cell that every instruction using it only writes to — a
//! mutator called on it (`.append`), a subscript stored into, `N += 1` stored back — is a
//! *sink*, which the output is not computed from.
//!
//! Both are read once per code object and remembered by it ([`code_facts`]): code never
//! changes once made, and a rerun in the same process reads no bytecode again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyBytes, PyCode, PyComplex, PyDict, PyFloat, PyFrozenSet, PyInt, PyString, PyTuple,
    PyWeakrefReference,
};

/// Derivation context: no digest of another kind can equal a code digest.
const CODE_CONTEXT: &str = "soma 2026-12 python code v1";

/// How deeply constants may nest (tuples in tuples, code in code): past what Python's parser
/// reads (it refuses 200 nested parentheses), and far short of what could exhaust a thread's
/// stack.
const DEEPEST: usize = 256;

fn length(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn text(out: &mut Vec<u8>, text: &Bound<'_, PyString>) -> PyResult<()> {
    // As UTF-8, a lone surrogate (which `str` may hold) encoded as it is.
    let encoded = match text.to_str() {
        Ok(plain) => plain.as_bytes().to_vec(),
        Err(_) => text
            .call_method1(intern!(text.py(), "encode"), ("utf-8", "surrogatepass"))?
            .cast_into::<PyBytes>()?
            .as_bytes()
            .to_vec(),
    };
    length(out, encoded.len());
    out.extend_from_slice(&encoded);
    Ok(())
}

fn names(out: &mut Vec<u8>, names: &Bound<'_, PyAny>) -> PyResult<()> {
    let names = names.cast::<PyTuple>()?;
    length(out, names.len());
    for name in names {
        text(out, name.cast::<PyString>()?)?;
    }
    Ok(())
}

fn bytes_of(out: &mut Vec<u8>, data: &Bound<'_, PyAny>) -> PyResult<()> {
    let data = data.cast::<PyBytes>()?.as_bytes();
    length(out, data.len());
    out.extend_from_slice(data);
    Ok(())
}

fn number(
    out: &mut Vec<u8>,
    code: &Bound<'_, PyAny>,
    attribute: &Bound<'_, PyString>,
) -> PyResult<()> {
    let n: u64 = code.getattr(attribute)?.extract()?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

/// Feeds `code`'s encoding into `out`.
fn feed_code(out: &mut Vec<u8>, code: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
    let py = code.py();
    for attribute in [
        intern!(py, "co_argcount"),
        intern!(py, "co_posonlyargcount"),
        intern!(py, "co_kwonlyargcount"),
        intern!(py, "co_flags"),
    ] {
        number(out, code, attribute)?;
    }
    text(
        out,
        code.getattr(intern!(py, "co_name"))?.cast::<PyString>()?,
    )?;
    bytes_of(out, &code.getattr(intern!(py, "co_code"))?)?;
    // 3.11 on: which instructions each `try` covers.
    match code.getattr(intern!(py, "co_exceptiontable")) {
        Ok(table) => bytes_of(out, &table)?,
        Err(_) => length(out, 0),
    }
    for attribute in [
        intern!(py, "co_names"),
        intern!(py, "co_varnames"),
        intern!(py, "co_cellvars"),
        intern!(py, "co_freevars"),
    ] {
        names(out, &code.getattr(attribute)?)?;
    }
    let constants = code.getattr(intern!(py, "co_consts"))?;
    let constants = constants.cast::<PyTuple>()?;
    length(out, constants.len());
    for constant in constants {
        feed_constant(out, &constant, depth + 1)?;
    }
    Ok(())
}

/// Feeds one constant of compiled code: only the kinds Python's compiler makes have one.
pub(crate) fn feed_constant(
    out: &mut Vec<u8>,
    constant: &Bound<'_, PyAny>,
    depth: usize,
) -> PyResult<()> {
    let py = constant.py();
    if depth > DEEPEST {
        return Err(PyTypeError::new_err(
            "constants nested too deeply to digest",
        ));
    }
    if constant.is_none() {
        out.push(b'N');
    } else if constant.is(py.Ellipsis()) {
        out.push(b'e');
    } else if let Ok(flag) = constant.cast_exact::<PyBool>() {
        out.push(if flag.is_true() { b'1' } else { b'0' });
    } else if let Ok(int) = constant.cast_exact::<PyInt>() {
        if let Ok(small) = int.extract::<i64>() {
            out.push(b'j');
            out.extend_from_slice(&small.to_le_bytes());
        } else {
            // Past 64 bits: its two's-complement bytes, as Python writes them.
            let bits: usize = int.call_method0(intern!(py, "bit_length"))?.extract()?;
            let signed = pyo3::types::PyDict::new(py);
            signed.set_item(intern!(py, "signed"), true)?;
            let data = int.call_method(
                intern!(py, "to_bytes"),
                ((bits + 8) / 8, intern!(py, "little")),
                Some(&signed),
            )?;
            out.push(b'I');
            bytes_of(out, &data)?;
        }
    } else if let Ok(float) = constant.cast_exact::<PyFloat>() {
        out.push(b'f');
        out.extend_from_slice(&float.value().to_bits().to_le_bytes());
    } else if let Ok(complex) = constant.cast_exact::<PyComplex>() {
        out.push(b'z');
        out.extend_from_slice(&complex.real().to_bits().to_le_bytes());
        out.extend_from_slice(&complex.imag().to_bits().to_le_bytes());
    } else if let Ok(string) = constant.cast_exact::<PyString>() {
        out.push(b's');
        text(out, string)?;
    } else if constant.cast_exact::<PyBytes>().is_ok() {
        out.push(b'b');
        bytes_of(out, constant)?;
    } else if let Ok(tuple) = constant.cast_exact::<PyTuple>() {
        out.push(b'(');
        length(out, tuple.len());
        for item in tuple {
            feed_constant(out, &item, depth + 1)?;
        }
    } else if let Ok(set) = constant.cast_exact::<PyFrozenSet>() {
        // In the order of its members' digests: its own order is its hashes'.
        let mut members = set
            .iter()
            .map(|member| {
                let mut one = Vec::new();
                feed_constant(&mut one, &member, depth + 1)?;
                Ok(*blake3::hash(&one).as_bytes())
            })
            .collect::<PyResult<Vec<_>>>()?;
        members.sort_unstable();
        out.push(b'>');
        length(out, members.len());
        for member in members {
            out.extend_from_slice(&member);
        }
    } else if constant.cast_exact::<PyCode>().is_ok() {
        out.push(b'k');
        feed_code(out, constant, depth + 1)?;
    } else {
        return Err(PyTypeError::new_err(format!(
            "a constant of type `{}` in compiled code",
            constant.get_type().name()?
        )));
    }
    Ok(())
}

/// The 32-byte digest of the code object `code`: what it does, not where it was written.
///
/// # Errors
/// `TypeError` for an object that is not code, or a constant of a kind Python's compiler
/// never makes.
#[pyfunction]
#[pyo3(name = "code_digest")]
pub fn py_code_digest<'py>(code: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(code.py(), &code_digest(code)?))
}

/// What a key reads of a code object, remembered by the object: its digest and the names it
/// looks up. Code never changes once made, so neither does this; a code object that goes
/// leaves its entry, held weakly, to be found dead and made again for whatever takes its place.
pub(crate) struct CodeFacts {
    held: Py<PyWeakrefReference>,
    pub(crate) digest: [u8; 32],
    globals: Vec<Py<PyString>>,
    attributes: Vec<Py<PyString>>,
    imports: Vec<(Py<PyString>, u32)>,
    sinks: Vec<Py<PyString>>,
    sink_cells: Vec<Py<PyString>>,
}

impl CodeFacts {
    /// The names it looks up, bound to `py`.
    pub(crate) fn reads<'py>(&self, py: Python<'py>) -> Reads<'py> {
        let bound = |names: &[Py<PyString>]| names.iter().map(|n| n.bind(py).clone()).collect();
        Reads {
            globals: bound(&self.globals),
            attributes: bound(&self.attributes),
            imports: self
                .imports
                .iter()
                .map(|(name, level)| (name.bind(py).clone(), *level))
                .collect(),
            sinks: bound(&self.sinks),
            sink_cells: bound(&self.sink_cells),
        }
    }
}

/// Code objects' facts by address, read under the GIL only.
type Facts = HashMap<usize, Arc<CodeFacts>>;

/// The facts of `code`, read once per code object.
///
/// # Errors
/// `TypeError` for an object that is not code, or a constant no compiler makes.
pub(crate) fn code_facts(code: &Bound<'_, PyAny>) -> PyResult<Arc<CodeFacts>> {
    static FACTS: Mutex<Option<Facts>> = Mutex::new(None);
    let py = code.py();
    let key = code.as_ptr() as usize;
    let known = {
        let facts = FACTS.lock().unwrap_or_else(PoisonError::into_inner);
        facts.as_ref().and_then(|facts| facts.get(&key).cloned())
    };
    if let Some(known) = known {
        if known
            .held
            .bind(py)
            .upgrade()
            .is_some_and(|alive| alive.is(code))
        {
            return Ok(known);
        }
    }
    let digest = digest_of_code(code)?;
    let Reads {
        globals,
        attributes,
        imports,
        sinks,
        sink_cells,
    } = reads_of(code)?;
    let unbound = |names: Vec<Bound<'_, PyString>>| names.into_iter().map(Bound::unbind).collect();
    let made = Arc::new(CodeFacts {
        held: PyWeakrefReference::new(code)?.unbind(),
        digest,
        globals: unbound(globals),
        attributes: unbound(attributes),
        imports: imports
            .into_iter()
            .map(|(name, level)| (name.unbind(), level))
            .collect(),
        sinks: unbound(sinks),
        sink_cells: unbound(sink_cells),
    });
    let mut facts = FACTS.lock().unwrap_or_else(PoisonError::into_inner);
    let facts = facts.get_or_insert_with(HashMap::new);
    if facts.len() > 1 << 16 {
        // Code made and dropped in a loop (`exec` of cells): start again rather than grow.
        facts.clear();
    }
    facts.insert(key, Arc::clone(&made));
    Ok(made)
}

/// The digest of a code object (see [`code_facts`]).
pub(crate) fn code_digest(code: &Bound<'_, PyAny>) -> PyResult<[u8; 32]> {
    Ok(code_facts(code)?.digest)
}

/// The digest [`code_digest`] answers, as bytes.
fn digest_of_code(code: &Bound<'_, PyAny>) -> PyResult<[u8; 32]> {
    if code.cast_exact::<PyCode>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "code_digest reads a code object, not an object of type `{}`",
            code.get_type().name()?
        )));
    }
    let mut out = Vec::with_capacity(512);
    feed_code(&mut out, code, 0)?;
    let mut hasher = blake3::Hasher::new_derive_key(CODE_CONTEXT);
    hasher.update(&out);
    Ok(*hasher.finalize().as_bytes())
}

/// The opcodes [`reads_of`] reads, as this interpreter numbers them, and how each packs the
/// index of its name in `co_names` into its argument (shifted right by so many bits).
struct Opcodes {
    extended_arg: u8,
    /// `CACHE`: the inline cache entries after an instruction (3.11 on), no instruction.
    cache: Option<u8>,
    /// `LOAD_GLOBAL`, with its shift.
    load_global: (u8, u32),
    /// `STORE_GLOBAL`, `DELETE_GLOBAL`: a global written, never read.
    write_globals: Vec<u8>,
    /// `LOAD_NAME`, `LOAD_FROM_DICT_OR_GLOBALS`: a global read, with its shift.
    read_globals: Vec<(u8, u32)>,
    /// `LOAD_ATTR`, `LOAD_METHOD`, `STORE_ATTR`, `LOAD_SUPER_ATTR`, `IMPORT_FROM`: an
    /// attribute.
    attributes: Vec<(u8, u32)>,
    /// `LOAD_ATTR` and `LOAD_METHOD`: an attribute read, its method called perhaps.
    load_attributes: Vec<(u8, u32)>,
    /// `IMPORT_NAME`: a module.
    import: u8,
    /// `LOAD_DEREF`: a closure's cell read.
    load_deref: Option<u8>,
    /// `STORE_DEREF`, `DELETE_DEREF`: a closure's cell written.
    write_derefs: Vec<u8>,
    /// `LOAD_CLASSDEREF`, `LOAD_FROM_DICT_OR_DEREF`: a cell read by a class body.
    read_derefs: Vec<u8>,
    /// `LOAD_CONST` and `LOAD_SMALL_INT` (3.14): a constant, as an import's level is loaded.
    load_const: Option<u8>,
    load_small_int: Option<u8>,
    /// What loads one value and reads nothing a key follows: a local, a constant.
    simple_loads: Vec<u8>,
    store_subscr: Option<u8>,
    binary_subscr: Option<u8>,
    binary_op: Option<u8>,
    copy: Option<u8>,
}

/// `BINARY_OP`'s argument for a subscript (3.14, where `BINARY_SUBSCR` went), and the range
/// of its in-place operators (`+=` to `^=`).
const NB_SUBSCR: u32 = 26;
const NB_INPLACE: std::ops::RangeInclusive<u32> = 13..=25;

/// The methods of a list, a dict, a set or a deque that change it in place and answer `None`:
/// code that only calls these on a value writes to it, and reads nothing of it.
const MUTATORS: [&str; 9] = [
    "append",
    "extend",
    "insert",
    "add",
    "update",
    "appendleft",
    "extendleft",
    "discard",
    "clear",
];

fn opcodes(py: Python<'_>) -> PyResult<&Opcodes> {
    static OPCODES: PyOnceLock<Opcodes> = PyOnceLock::new();
    OPCODES.get_or_try_init(py, || {
        let opmap = py
            .import("opcode")?
            .getattr("opmap")?
            .cast_into::<PyDict>()?;
        let minor: u32 = py
            .import("sys")?
            .getattr("version_info")?
            .getattr("minor")?
            .extract()?;
        // From 3.12 on `opmap` holds pseudo-instructions too (`LOAD_METHOD` among them),
        // numbered from 256: the compiler rewrites them before any reaches `co_code`, whose
        // opcodes are one byte, so such a number is an instruction no code holds.
        let code = |name: &str| -> PyResult<Option<u8>> {
            Ok(opmap
                .get_item(name)?
                .map(|found| found.extract::<u32>())
                .transpose()?
                .and_then(|number| u8::try_from(number).ok()))
        };
        let with = |names: &[(&str, u32)]| -> PyResult<Vec<(u8, u32)>> {
            let mut found = Vec::new();
            for &(name, shift) in names {
                if let Some(op) = code(name)? {
                    found.push((op, shift));
                }
            }
            Ok(found)
        };
        let all = |names: &[&str]| -> PyResult<Vec<u8>> {
            let mut found = Vec::new();
            for name in names {
                found.extend(code(name)?);
            }
            Ok(found)
        };
        // 3.11 packs a flag into `LOAD_GLOBAL`'s lowest bit, 3.12 into `LOAD_ATTR`'s too.
        let attribute_shift = u32::from(minor >= 12);
        let load_attributes = with(&[("LOAD_ATTR", attribute_shift), ("LOAD_METHOD", 0)])?;
        Ok(Opcodes {
            extended_arg: code("EXTENDED_ARG")?.unwrap_or(144),
            cache: code("CACHE")?,
            load_global: (code("LOAD_GLOBAL")?.unwrap_or(116), 1),
            write_globals: all(&["STORE_GLOBAL", "DELETE_GLOBAL"])?,
            read_globals: with(&[("LOAD_NAME", 0), ("LOAD_FROM_DICT_OR_GLOBALS", 0)])?,
            attributes: with(&[
                ("LOAD_ATTR", attribute_shift),
                ("LOAD_METHOD", 0),
                ("STORE_ATTR", 0),
                ("LOAD_SUPER_ATTR", 2),
                ("IMPORT_FROM", 0),
            ])?,
            load_attributes,
            import: code("IMPORT_NAME")?.unwrap_or(108),
            load_deref: code("LOAD_DEREF")?,
            write_derefs: all(&["STORE_DEREF", "DELETE_DEREF"])?,
            read_derefs: all(&["LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF"])?,
            load_const: code("LOAD_CONST")?,
            load_small_int: code("LOAD_SMALL_INT")?,
            simple_loads: all(&[
                "LOAD_CONST",
                "LOAD_SMALL_INT",
                "LOAD_FAST",
                "LOAD_FAST_BORROW",
                "LOAD_FAST_CHECK",
            ])?,
            store_subscr: code("STORE_SUBSCR")?,
            binary_subscr: code("BINARY_SUBSCR")?,
            binary_op: code("BINARY_OP")?,
            copy: code("COPY")?,
        })
    })
}

/// The names a code object, and the code nested in it (comprehensions, lambdas, inner
/// functions), looks up: each once, in the order first met.
pub(crate) struct Reads<'py> {
    /// Read (or written) as globals: `helper(x)`, `THRESHOLD`.
    pub(crate) globals: Vec<Bound<'py, PyString>>,
    /// Read as attributes: `helpers.scale`, `self.k`; a module of the user's the code reads is
    /// followed by these.
    pub(crate) attributes: Vec<Bound<'py, PyString>>,
    /// Imported in its body, with the import's level: `import helpers` (0), `from .helpers
    /// import scale` (1, `helpers`), `from . import helpers` (1, an empty name).
    pub(crate) imports: Vec<(Bound<'py, PyString>, u32)>,
    /// The globals among `globals` that the code only writes to: each use of the name is the
    /// target of a store — `LOG.append(x)`, `COUNTS[k] = v`, `COUNTS[k] += 1`, `global N;
    /// N += 1` — never a read whose value goes anywhere else.
    pub(crate) sinks: Vec<Bound<'py, PyString>>,
    /// The closure's variables (its free variables' names) the code only writes to, likewise.
    pub(crate) sink_cells: Vec<Bound<'py, PyString>>,
}

/// A code object's instructions, `CACHE` entries left out and `EXTENDED_ARG` folded in.
fn instructions(ops: &Opcodes, code: &[u8]) -> Vec<(u8, u32)> {
    let mut found = Vec::with_capacity(code.len() / 2);
    let mut extended: u32 = 0;
    for unit in code.chunks_exact(2) {
        let (op, arg) = (unit[0], u32::from(unit[1]) | extended);
        if op == ops.extended_arg {
            extended = arg << 8;
            continue;
        }
        extended = 0;
        if ops.cache == Some(op) {
            continue;
        }
        found.push((op, arg));
    }
    found
}

/// How a name is used by one instruction: read, or only written to.
#[derive(Clone, Copy)]
enum Use {
    Read,
    Write,
}

/// Whether the value loaded by `at`'s instruction is only written to by what follows it: a
/// mutator called on it (`.append`), a subscript stored into (`[k] =`, `[k] += v`), or, where
/// `rebinds` says which instruction stores the name again, an in-place operator whose result
/// is stored back (`N += 1`).
fn written_only(
    ops: &Opcodes,
    names: &Bound<'_, PyTuple>,
    code: &[(u8, u32)],
    at: usize,
    rebinds: impl Fn(u8, u32) -> bool,
) -> bool {
    let op_at = |i: usize| code.get(i).copied();
    let is = |i: usize, op: Option<u8>| op.is_some() && op_at(i).map(|(found, _)| found) == op;
    let simple = |i: usize| op_at(i).is_some_and(|(op, _)| ops.simple_loads.contains(&op));
    if let Some((op, arg)) = op_at(at + 1) {
        if let Some(&(_, shift)) = ops.load_attributes.iter().find(|&&(a, _)| a == op) {
            return names
                .get_item((arg >> shift) as usize)
                .ok()
                .and_then(|name| name.cast_into::<PyString>().ok())
                .is_some_and(|name| name.to_str().is_ok_and(|name| MUTATORS.contains(&name)));
        }
    }
    if !simple(at + 1) {
        return false;
    }
    if is(at + 2, ops.store_subscr) {
        return true;
    }
    let subscript = |i: usize| {
        is(i, ops.binary_subscr)
            || (is(i, ops.binary_op) && op_at(i).is_some_and(|(_, arg)| arg == NB_SUBSCR))
    };
    let copies = |i: usize| is(i, ops.copy) && op_at(i).is_some_and(|(_, arg)| arg == 2);
    if copies(at + 2) && copies(at + 3) && subscript(at + 4) {
        return true;
    }
    is(at + 2, ops.binary_op)
        && op_at(at + 2).is_some_and(|(_, arg)| NB_INPLACE.contains(&arg))
        && op_at(at + 3).is_some_and(|(op, arg)| rebinds(op, arg))
}

/// How the instruction at `at` uses a global, if it does: the name's index in `co_names`, and
/// whether it reads it or only writes to it.
fn global_use(
    ops: &Opcodes,
    names: &Bound<'_, PyTuple>,
    code: &[(u8, u32)],
    at: usize,
) -> Option<(u32, Use)> {
    let (op, arg) = code[at];
    if op == ops.load_global.0 {
        let index = arg >> ops.load_global.1;
        let rebinds = |next: u8, by: u32| ops.write_globals.first() == Some(&next) && by == index;
        let only = written_only(ops, names, code, at, rebinds);
        Some((index, if only { Use::Write } else { Use::Read }))
    } else if ops.write_globals.contains(&op) {
        Some((arg, Use::Write))
    } else {
        let &(_, shift) = ops.read_globals.iter().find(|&&(g, _)| g == op)?;
        Some((arg >> shift, Use::Read))
    }
}

/// How the instruction at `at` uses a closure's cell, if it does.
fn cell_use(
    ops: &Opcodes,
    names: &Bound<'_, PyTuple>,
    code: &[(u8, u32)],
    at: usize,
) -> Option<Use> {
    let (op, arg) = code[at];
    if ops.load_deref == Some(op) {
        let rebinds = |next: u8, by: u32| ops.write_derefs.first() == Some(&next) && by == arg;
        let only = written_only(ops, names, code, at, rebinds);
        Some(if only { Use::Write } else { Use::Read })
    } else if ops.write_derefs.contains(&op) {
        Some(Use::Write)
    } else if ops.read_derefs.contains(&op) {
        Some(Use::Read)
    } else {
        None
    }
}

/// The level of the import at `at` (`IMPORT_NAME`), loaded two instructions before it
/// (`LOAD_CONST level`, then `LOAD_CONST fromlist`): 0, absolute, where it cannot be read.
fn import_level(
    ops: &Opcodes,
    constants: &Bound<'_, PyTuple>,
    code: &[(u8, u32)],
    at: usize,
) -> u32 {
    at.checked_sub(2)
        .and_then(|before| code.get(before))
        .and_then(|&(load, value)| {
            if ops.load_small_int == Some(load) {
                Some(value)
            } else if ops.load_const == Some(load) {
                constants
                    .get_item(value as usize)
                    .ok()
                    .and_then(|level| level.extract::<u32>().ok())
            } else {
                None
            }
        })
        .unwrap_or(0)
}

/// The name of the cell `arg` of `code` reads or writes (`LOAD_DEREF`'s argument), as the
/// interpreter numbers them.
fn cell_name<'py>(code: &Bound<'py, PyAny>, arg: u32) -> Option<Bound<'py, PyString>> {
    code.call_method1(intern!(code.py(), "_varname_from_oparg"), (arg,))
        .ok()
        .and_then(|name| name.cast_into::<PyString>().ok())
}

/// What `code` and the code nested in it look up, read from its instructions.
///
/// # Errors
/// What reading a code object's attributes raised.
pub(crate) fn reads_of<'py>(code: &Bound<'py, PyAny>) -> PyResult<Reads<'py>> {
    let py = code.py();
    let ops = opcodes(py)?;
    let mut reads = Reads {
        globals: Vec::new(),
        attributes: Vec::new(),
        imports: Vec::new(),
        sinks: Vec::new(),
        sink_cells: Vec::new(),
    };
    // By the string object: a code object's names are interned when it is made, so one name
    // is one object (and were it two, it would be two the same way in every process).
    let mut seen: [HashSet<usize>; 3] = Default::default();
    // How each global and each cell is used, by name: read anywhere, or only written to.
    let mut global_uses: HashMap<usize, (Bound<'py, PyString>, bool)> = HashMap::new();
    let mut cell_uses: HashMap<String, (Bound<'py, PyString>, bool)> = HashMap::new();
    let mut pending = vec![code.clone()];
    while let Some(part) = pending.pop() {
        let names = part.getattr(intern!(py, "co_names"))?;
        let names = names.cast::<PyTuple>()?;
        let constants = part.getattr(intern!(py, "co_consts"))?;
        let constants = constants.cast::<PyTuple>()?;
        let raw = part.getattr(intern!(py, "co_code"))?;
        let code = instructions(ops, raw.cast::<PyBytes>()?.as_bytes());
        let name_at = |index: u32| -> PyResult<Option<Bound<'py, PyString>>> {
            match names.get_item(index as usize) {
                Ok(name) => Ok(Some(name.cast_into::<PyString>()?)),
                Err(_) => Ok(None),
            }
        };
        for (at, &(op, arg)) in code.iter().enumerate() {
            if let Some((index, used)) = global_use(ops, names, &code, at) {
                if let Some(name) = name_at(index)? {
                    let key = name.as_ptr() as usize;
                    if seen[0].insert(key) {
                        reads.globals.push(name.clone());
                    }
                    let entry = global_uses.entry(key).or_insert((name, false));
                    entry.1 |= matches!(used, Use::Read);
                }
                continue;
            }
            if let Some(used) = cell_use(ops, names, &code, at) {
                if let Some(name) = cell_name(&part, arg) {
                    let text = name.to_string_lossy().into_owned();
                    let entry = cell_uses.entry(text).or_insert((name, false));
                    entry.1 |= matches!(used, Use::Read);
                }
                continue;
            }
            if op == ops.import {
                let Some(name) = name_at(arg)? else { continue };
                let level = import_level(ops, constants, &code, at);
                let key = name.as_ptr() as usize ^ (level as usize).rotate_right(8);
                if seen[2].insert(key) {
                    reads.imports.push((name, level));
                }
                continue;
            }
            if let Some(&(_, shift)) = ops.attributes.iter().find(|&&(a, _)| a == op) {
                if let Some(name) = name_at(arg >> shift)? {
                    if seen[1].insert(name.as_ptr() as usize) {
                        reads.attributes.push(name);
                    }
                }
            }
        }
        let nested: Vec<_> = constants
            .iter()
            .filter(PyAnyMethods::is_exact_instance_of::<PyCode>)
            .collect();
        pending.extend(nested.into_iter().rev());
    }
    for name in &reads.globals {
        if global_uses
            .get(&(name.as_ptr() as usize))
            .is_some_and(|(_, read)| !read)
        {
            reads.sinks.push(name.clone());
        }
    }
    let mut cells: Vec<_> = cell_uses
        .into_values()
        .filter(|(_, read)| !read)
        .map(|(name, _)| name)
        .collect();
    cells.sort_by_key(|name| name.to_string_lossy().into_owned());
    reads.sink_cells = cells;
    Ok(reads)
}
