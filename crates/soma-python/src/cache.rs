//! A Python run cache as the engine's `NodeCache`: the engine chains the keys, Python
//! fingerprints nodes, digests values and keeps the entries (`soma/cache/_cache.py`).
//!
//! A rerun's hit asks for each node's fingerprint; when Python remembered it
//! (`soma.cache._fingerprint`'s `_REMEMBERED`, a [`Remembered`] by node) and its witness says
//! nothing it was read from was rebound, it is read here, without a Python frame: most of what a
//! hit cost beyond the engine was the frames that found it.
//!
//! The Python side is one object per forward with ten methods: `fingerprint(id)`,
//! `digest(value)` and `input_digest(id, value)` answering 32 bytes or `None`,
//! `digest_items(value)` and `input_digest_items(id, value)` answering that and the digests of
//! the value's items (a list of 32 bytes each, or `None`), `get(key)`
//! answering `(found, value, digest)`, `peek(key)` answering `(found, digest)`, `find(key)`
//! answering `(found, digest, read, output or unread)` and `read(unread)` answering `(found,
//! value)` (a hit whose output is read only when a node that runs needs it:
//! `soma_core::NodeCache::find`),
//! and `put(id, key, value, digest, seconds)`. None of them may fail the run: the
//! Python side turns what it cannot do into a miss, with a warning; anything it still raises is
//! reported as unraisable and read as a miss here, except Ctrl-C, which stops the run as in a
//! node.

use std::time::Duration;

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use soma_core::{Entry, Found, Key, Node, NodeCache, NodeId, Unread, Value};

use crate::convert::{to_python, wrap};
use crate::watch::note_interrupt;
use crate::witness::Remembered;

/// How a run cache finds the Python object of a node by its id, a path inside steps included:
/// the graph's to answer (`GraphCore::run_cache` makes it), which this module does not name.
pub type Implementations = Box<dyn Fn(Python<'_>, &str) -> Option<Py<PyAny>> + Send + Sync>;

/// The run cache of one forward, as the engine asks it.
pub struct PythonCache {
    run: Py<PyAny>,
    /// How the run's graph finds a node, and the fingerprints Python remembered by node: what
    /// a hit's fingerprint is read from here. `None` when that module could not be read (the
    /// fingerprint is then always asked).
    remembered: Option<(Implementations, Py<PyDict>)>,
}

/// `soma.cache._fingerprint._REMEMBERED`, looked up once: the same dict for the life of the module.
fn remembered_fingerprints(py: Python<'_>) -> Option<Py<PyDict>> {
    static REMEMBERED: PyOnceLock<Option<Py<PyDict>>> = PyOnceLock::new();
    REMEMBERED
        .get_or_init(py, || {
            crate::py_modules::fingerprint(py)
                .and_then(|module| module.getattr("_REMEMBERED"))
                .and_then(|found| Ok(found.cast_into::<PyDict>()?.unbind()))
                .ok()
        })
        .as_ref()
        .map(|dict| dict.clone_ref(py))
}

impl PythonCache {
    /// The run cache `cache` (a `soma.Cache`) opens for one run of `graph`, whose nodes
    /// `implementations` finds: made here, by its `_run(graph)`, for every run that takes a
    /// cache, so no caller makes it.
    pub fn of(
        cache: &Bound<'_, PyAny>,
        graph: &Bound<'_, PyAny>,
        implementations: Implementations,
    ) -> PyResult<Self> {
        let py = cache.py();
        let run = cache.call_method1(intern!(py, "_run"), (graph,))?;
        let remembered = remembered_fingerprints(py).map(|dict| (implementations, dict));
        Ok(PythonCache {
            run: run.unbind(),
            remembered,
        })
    }

    /// Node `id`'s fingerprint as Python remembered it, when nothing it was read from changed
    /// since; `None` when Python must be asked.
    fn remembered(&self, py: Python<'_>, id: &NodeId) -> Option<Key> {
        let (implementations, remembered) = self.remembered.as_ref()?;
        let node = implementations(py, id.as_str())?;
        let node = node.bind(py);
        // Remembered only while it is cacheable: a `cacheable = False` set since on it or on
        // any class of its MRO fails its witness (`soma.cache._fingerprint._remember`).
        let entry = remembered
            .bind(py)
            .get_item(node.as_ptr() as usize)
            .ok()??;
        let entry = entry.cast::<Remembered>().ok()?;
        match entry.get().unchanged(py, node) {
            Ok(found) => found.map(Key::from_bytes),
            Err(raised) => {
                self.report(py, raised);
                None
            }
        }
    }

    /// What a call into the run cache raised: see [`report`].
    fn report(&self, py: Python<'_>, raised: PyErr) {
        report(self.run.bind(py), raised);
    }

    /// Calls `method` (interned: a hit asks twice per node) on the run cache, through
    /// [`crate::exit::call_method`]: it digests and pickles the user's values on the run's
    /// threads, as long as a node may. What it raises is reported and read as `None`.
    fn ask<'py>(
        &self,
        py: Python<'py>,
        method: &Bound<'py, PyString>,
        args: impl IntoPyObject<'py, Output = Bound<'py, PyTuple>, Error: Into<PyErr>>,
    ) -> Option<Bound<'py, PyAny>> {
        match crate::exit::call_method(self.run.bind(py), method, args) {
            Ok(answer) => Some(answer),
            Err(raised) => {
                self.report(py, raised);
                None
            }
        }
    }
}

/// What a call into the run cache `run` raised, which no run may fail for: Ctrl-C stops the run
/// as in a node, and is signalled again, so that the caller gets it even when no node boundary
/// comes after it (the last node's lookup); anything else is reported as unraisable.
fn report(run: &Bound<'_, PyAny>, raised: PyErr) {
    let py = run.py();
    if raised.is_instance_of::<PyKeyboardInterrupt>(py) {
        note_interrupt();
        // SAFETY: called with the GIL held; it only marks SIGINT as arrived, for the main
        // thread's next check of signals to raise `KeyboardInterrupt` there.
        #[allow(unsafe_code)]
        unsafe {
            pyo3::ffi::PyErr_SetInterrupt();
        }
    } else {
        raised.write_unraisable(py, Some(run));
    }
}

/// What the Python side's `get` answers: found, the output, its digest (or `None`).
type Answer<'py> = (bool, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// What the Python side's `find` answers: found, the digest, whether the output is read
/// already, and the output or what `read` reads it from.
type Finding<'py> = (bool, Bound<'py, PyAny>, bool, Bound<'py, PyAny>);

/// 32 bytes as a key; anything else (`None`) as none.
fn key_of(answer: Option<Bound<'_, PyAny>>) -> Option<Key> {
    let answer = answer?;
    let bytes = answer.cast::<PyBytes>().ok()?.as_bytes();
    <[u8; 32]>::try_from(bytes).ok().map(Key::from_bytes)
}

/// What `digest_items` and `input_digest_items` answer, `(digest, items)`, as keys: the items
/// none unless each is 32 bytes.
fn keys_of(answer: Option<Bound<'_, PyAny>>) -> (Option<Key>, Option<Box<[Key]>>) {
    let Some((digest, items)) = answer.and_then(|answer| {
        answer
            .extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()
            .ok()
    }) else {
        return (None, None);
    };
    let items = items.cast::<PyList>().ok().and_then(|items| {
        items
            .iter()
            .map(|item| key_of(Some(item)))
            .collect::<Option<Box<[Key]>>>()
    });
    (key_of(Some(digest)), items)
}

impl NodeCache for PythonCache {
    fn fingerprint(&self, id: &NodeId, _node: &dyn Node) -> Option<Key> {
        crate::exit::attach(|py| {
            self.remembered(py, id)
                .or_else(|| key_of(self.ask(py, intern!(py, "fingerprint"), (id.as_str(),))))
        })
    }

    fn digest(&self, value: &Value) -> Option<Key> {
        crate::exit::attach(|py| {
            let value = to_python(py, value).ok()?;
            key_of(self.ask(py, intern!(py, "digest"), (value,)))
        })
    }

    fn digest_input(&self, id: &NodeId, input: &Value) -> Option<Key> {
        crate::exit::attach(|py| {
            let input = to_python(py, input).ok()?;
            key_of(self.ask(py, intern!(py, "input_digest"), (id.as_str(), input)))
        })
    }

    fn digest_items(&self, value: &Value) -> (Option<Key>, Option<Box<[Key]>>) {
        crate::exit::attach(|py| {
            let Ok(value) = to_python(py, value) else {
                return (None, None);
            };
            keys_of(self.ask(py, intern!(py, "digest_items"), (value,)))
        })
    }

    fn digest_input_items(&self, id: &NodeId, input: &Value) -> (Option<Key>, Option<Box<[Key]>>) {
        crate::exit::attach(|py| {
            let Ok(input) = to_python(py, input) else {
                return (None, None);
            };
            let method = intern!(py, "input_digest_items");
            keys_of(self.ask(py, method, (id.as_str(), input)))
        })
    }

    fn get(&self, _id: &NodeId, key: &Key) -> Option<Entry> {
        crate::exit::attach(|py| {
            let key = PyBytes::new(py, key.as_bytes());
            let answer = self.ask(py, intern!(py, "get"), (key,))?;
            let (found, value, digest): Answer<'_> = answer.extract().ok()?;
            found.then(|| Entry {
                value: wrap(value),
                digest: key_of(Some(digest)),
            })
        })
    }

    fn find(&self, _id: &NodeId, key: &Key) -> Option<Found> {
        crate::exit::attach(|py| {
            let key = PyBytes::new(py, key.as_bytes());
            let answer = self.ask(py, intern!(py, "find"), (key,))?;
            let (found, digest, read, what): Finding<'_> = answer.extract().ok()?;
            if !found {
                return None;
            }
            let digest = key_of(Some(digest));
            if read {
                return Some(Found::Read(Entry {
                    value: wrap(what),
                    digest,
                }));
            }
            let run = self.run.clone_ref(py);
            let unread = what.unbind();
            Some(Found::Unread(Unread {
                digest,
                read: Box::new(move || {
                    crate::exit::attach(|py| {
                        let run = run.bind(py);
                        let method = intern!(py, "read");
                        let answer = match crate::exit::call_method(run, method, (unread.bind(py),))
                        {
                            Ok(answer) => answer,
                            Err(raised) => {
                                report(run, raised);
                                return None;
                            }
                        };
                        let (found, value): (bool, Bound<'_, PyAny>) = answer.extract().ok()?;
                        found.then(|| wrap(value))
                    })
                }),
            }))
        })
    }

    fn peek(&self, _id: &NodeId, key: &Key) -> Option<Option<Key>> {
        crate::exit::attach(|py| {
            let key = PyBytes::new(py, key.as_bytes());
            let answer = self.ask(py, intern!(py, "peek"), (key,))?;
            let (found, digest): (bool, Bound<'_, PyAny>) = answer.extract().ok()?;
            found.then(|| key_of(Some(digest)))
        })
    }

    fn put(&self, id: &NodeId, key: &Key, entry: &Entry, took: Duration) {
        crate::exit::attach(|py| {
            let Ok(value) = to_python(py, &entry.value) else {
                return;
            };
            let key = PyBytes::new(py, key.as_bytes());
            let digest = entry
                .digest
                .map(|digest| PyBytes::new(py, digest.as_bytes()));
            let seconds = took.as_secs_f64();
            self.ask(
                py,
                intern!(py, "put"),
                (id.as_str(), key, value, digest, seconds),
            );
        });
    }
}
