//! A Python run cache as the engine's `NodeCache`: the engine chains the keys, Python
//! fingerprints nodes, digests values and keeps the entries (`soma/_cache.py`).
//!
//! The Python side is one object per forward with six methods: `fingerprint(id)`,
//! `digest(value)` and `input_digest(id, value)` answering 32 bytes or `None`, `get(id, key)`
//! answering `(found, value, digest)`, `peek(id, key)` answering `(found, digest)`, and
//! `put(id, key, value, digest, seconds)`. None of them may fail the run: the
//! Python side turns what it cannot do into a miss, with a warning; anything it still raises is
//! reported as unraisable and read as a miss here, except Ctrl-C, which stops the run as in a
//! node.

use std::time::Duration;

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use soma_core::{Entry, Key, Node, NodeCache, NodeId, Value};

use crate::convert::{to_python, wrap};
use crate::watch::note_interrupt;

/// The run cache of one forward, as the engine asks it.
pub struct PythonCache {
    run: Py<PyAny>,
}

impl PythonCache {
    pub fn new(run: &Bound<'_, PyAny>) -> Self {
        PythonCache {
            run: run.clone().unbind(),
        }
    }

    /// Calls `method` (interned: a hit asks twice per node) on the run cache; what it raises is
    /// reported and read as `None`.
    fn ask<'py>(
        &self,
        py: Python<'py>,
        method: &Bound<'py, PyString>,
        args: impl pyo3::call::PyCallArgs<'py>,
    ) -> Option<Bound<'py, PyAny>> {
        match self.run.bind(py).call_method1(method, args) {
            Ok(answer) => Some(answer),
            Err(raised) => {
                if raised.is_instance_of::<PyKeyboardInterrupt>(py) {
                    note_interrupt();
                } else {
                    raised.write_unraisable(py, Some(self.run.bind(py)));
                }
                None
            }
        }
    }
}

/// What the Python side's `get` answers: found, the output, its digest (or `None`).
type Answer<'py> = (bool, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// 32 bytes as a key; anything else (`None`) as none.
fn key_of(answer: Option<Bound<'_, PyAny>>) -> Option<Key> {
    let answer = answer?;
    let bytes = answer.cast::<PyBytes>().ok()?.as_bytes();
    <[u8; 32]>::try_from(bytes).ok().map(Key::from_bytes)
}

impl NodeCache for PythonCache {
    fn fingerprint(&self, id: &NodeId, _node: &dyn Node) -> Option<Key> {
        Python::attach(|py| key_of(self.ask(py, intern!(py, "fingerprint"), (id.as_str(),))))
    }

    fn digest(&self, value: &Value) -> Option<Key> {
        Python::attach(|py| {
            let value = to_python(py, value).ok()?;
            key_of(self.ask(py, intern!(py, "digest"), (value,)))
        })
    }

    fn digest_input(&self, id: &NodeId, input: &Value) -> Option<Key> {
        Python::attach(|py| {
            let input = to_python(py, input).ok()?;
            key_of(self.ask(py, intern!(py, "input_digest"), (id.as_str(), input)))
        })
    }

    fn get(&self, id: &NodeId, key: &Key) -> Option<Entry> {
        Python::attach(|py| {
            let key = PyBytes::new(py, key.as_bytes());
            let answer = self.ask(py, intern!(py, "get"), (id.as_str(), key))?;
            let (found, value, digest): Answer<'_> = answer.extract().ok()?;
            found.then(|| Entry {
                value: wrap(value),
                digest: key_of(Some(digest)),
            })
        })
    }

    fn peek(&self, id: &NodeId, key: &Key) -> Option<Option<Key>> {
        Python::attach(|py| {
            let key = PyBytes::new(py, key.as_bytes());
            let answer = self.ask(py, intern!(py, "peek"), (id.as_str(), key))?;
            let (found, digest): (bool, Bound<'_, PyAny>) = answer.extract().ok()?;
            found.then(|| key_of(Some(digest)))
        })
    }

    fn put(&self, id: &NodeId, key: &Key, entry: &Entry, took: Duration) {
        Python::attach(|py| {
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
