//! `soma.Trace`: a run's spans, as Python sees them, and the ways to look at them.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use soma_core::{Device, NodeId, Span, Trace};

/// Spans recorded by `forward(..., trace=trace)`: one per node, with its thread and branch.
#[pyclass(frozen, module = "soma", name = "Trace")]
pub struct PyTrace {
    pub trace: Arc<Trace>,
}

/// One node's run; times in seconds since the trace was created.
#[pyclass(frozen, module = "soma", name = "Span", get_all)]
pub struct PySpan {
    /// The node.
    node: String,
    /// When its first turn started.
    start: f64,
    /// When it was done, or failed.
    end: f64,
    /// The thread it ran on (a process-wide number, stable for the thread's life).
    thread: u64,
    /// The branch it ran in: `main`, or its index in each enclosing wave joined by dots.
    branch: String,
    /// Calls to its `forward`.
    turns: u32,
    /// Its error, if it failed.
    error: Option<String>,
    /// The device it was placed on, if any.
    device: Option<String>,
    /// The host it ran on, for a node of a slice that ran on one.
    host: Option<String>,
    /// Whether its output came from the run's cache: the node was not called.
    cached: bool,
}

/// A span as it travels from a host back to the caller: node, start, end, thread, branch path,
/// turns, error, device, whether it was found in a cache. Plain values, so any transport can
/// carry it.
type Shipped = (
    String,
    f64,
    f64,
    u64,
    Vec<usize>,
    u32,
    Option<String>,
    Option<String>,
    bool,
);

impl From<&Span> for PySpan {
    fn from(span: &Span) -> Self {
        PySpan {
            node: span.node.to_string(),
            start: span.start.as_secs_f64(),
            end: span.end.as_secs_f64(),
            thread: span.thread,
            branch: span.branch_label(),
            turns: span.turns,
            error: span.error.clone(),
            device: span.device.map(|device| device.to_string()),
            host: span.host.as_ref().map(ToString::to_string),
            cached: span.cached,
        }
    }
}

#[pymethods]
impl PySpan {
    /// Itself: a span is immutable, so a copy could never differ from it.
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Itself, as [`PySpan::__copy__`].
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    /// `end - start`, in seconds.
    #[getter]
    fn duration(&self) -> f64 {
        self.end - self.start
    }

    fn __repr__(&self) -> String {
        format!(
            "Span(node={:?}, duration={:.6}, thread={}, branch={:?}, turns={}{}{})",
            self.node,
            self.duration(),
            self.thread,
            self.branch,
            self.turns,
            self.error
                .as_ref()
                .map_or_else(String::new, |e| format!(", error={e:?}")),
            self.host
                .as_ref()
                .map_or_else(String::new, |h| format!(", host={h:?}"))
        )
    }
}

#[pymethods]
impl PyTrace {
    #[new]
    fn new() -> Self {
        PyTrace {
            trace: Arc::new(Trace::new()),
        }
    }

    /// The spans, in the order they ended.
    #[getter]
    fn spans(&self) -> Vec<PySpan> {
        self.trace.spans().iter().map(PySpan::from).collect()
    }

    /// Forgets every span.
    fn clear(&self) {
        self.trace.clear();
    }

    // Throughout the API `to_*` returns text and `write_*` writes a file, as `Plan.to_*` and the
    // core's `Trace::to_chrome` do, so a reader guesses right which one touches the disk.

    /// The Chrome trace-event JSON that Perfetto and `chrome://tracing` open, a track per
    /// thread named after it (the caller's, a crew's, an event loop's, a host's).
    fn to_chrome(&self) -> String {
        self.trace.to_chrome()
    }

    /// Writes the JSON of `to_chrome` to `path`.
    fn write_chrome(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let json = self.trace.to_chrome();
        crate::exit::detach(py, move || std::fs::write(path, json))?;
        Ok(())
    }

    /// A table of the `top` slowest nodes, each with its share of the node-seconds; a step's
    /// items, cases or iterations one row.
    #[pyo3(signature = (top=10))]
    fn summary(&self, top: usize) -> String {
        self.trace.summary(top)
    }

    /// A timeline, one row per thread, as SVG.
    fn to_svg(&self) -> String {
        self.trace.to_svg()
    }

    fn _repr_svg_(&self) -> String {
        self.trace.to_svg()
    }

    fn __len__(&self) -> usize {
        self.trace.len()
    }

    /// Seconds since the trace was created: when a slice leaves for its host, on this trace's
    /// clock ([`PyTrace::_adopt`]).
    fn _now(&self) -> f64 {
        self.trace.now().as_secs_f64()
    }

    /// The spans of `nodes` as plain values, for a host to send back with its slice's result.
    #[allow(clippy::needless_pass_by_value)] // PyO3 hands arguments over as owned values.
    fn _ship(&self, nodes: std::collections::HashSet<String>) -> Vec<Shipped> {
        self.trace
            .spans()
            .into_iter()
            .filter(|span| nodes.contains(span.node.as_str()))
            .map(|span| {
                (
                    span.node.to_string(),
                    span.start.as_secs_f64(),
                    span.end.as_secs_f64(),
                    span.thread,
                    span.branch,
                    span.turns,
                    span.error,
                    span.device.map(|device| device.to_string()),
                    span.cached,
                )
            })
            .collect()
    }

    /// Records the spans a slice's host shipped back (`_ship` there), timed from `at`
    /// (`_now()` here when the slice left), on tracks of their own marked with `host`.
    fn _adopt(&self, py: Python<'_>, spans: Vec<Shipped>, host: &str, at: f64) -> PyResult<()> {
        let host = crate::hosts::read(py, host)?;
        // Seconds from another clock: one that went backwards counts from zero.
        let since =
            |seconds: f64| Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or_default();
        let at = since(at);
        let mut adopted = Vec::with_capacity(spans.len());
        for (node, start, end, thread, branch, turns, error, device, cached) in spans {
            adopted.push(Span {
                node: NodeId::from(node),
                start: since(start),
                end: since(end),
                thread,
                branch,
                turns,
                error,
                device: device.and_then(|device| device.parse::<Device>().ok()),
                host: None,
                // Found in the folder cache the host opened (see `soma/remote/_slices.py`).
                cached,
                part_of: None,
            });
        }
        self.trace.adopt(adopted, &host, at);
        Ok(())
    }

    /// Records spans of nodes that ran in this process outside the engine's own walk of a plan
    /// — an async node on the event loop, a piece of a plan `aforward` lent a thread — given as
    /// `_ship` gives them (a span found in the run's cache says so itself): each moved `at`
    /// seconds later (a piece's own trace starts when the piece does) and its branch path put
    /// after `prefix`, the branch the piece ran in. Thread numbers are kept: they are this
    /// process's.
    #[allow(clippy::needless_pass_by_value)] // PyO3 hands arguments over as owned values.
    fn _record(&self, spans: Vec<Shipped>, at: f64, prefix: Vec<usize>) {
        let since =
            |seconds: f64| Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or_default();
        let at = since(at);
        for (node, start, end, thread, branch, turns, error, device, cached) in spans {
            self.trace.record(Span {
                node: NodeId::from(node),
                start: at + since(start),
                end: at + since(end),
                thread,
                branch: prefix.iter().copied().chain(branch).collect(),
                turns,
                error,
                device: device.and_then(|device| device.parse::<Device>().ok()),
                host: None,
                cached,
                part_of: None,
            });
        }
    }

    /// The calling thread's number in traces.
    #[staticmethod]
    fn _thread() -> u64 {
        soma_core::thread_number()
    }

    /// Refused. A trace is where runs record, not a record: a copy would have to say whether
    /// later runs add to it, and its times count from its own creation. The spans already are
    /// immutable values, so keeping them is the copy one wants.
    fn __copy__(_slf: Py<Self>) -> PyResult<()> {
        Err(refuse_copy("copy.copy"))
    }

    /// Refused, as [`PyTrace::__copy__`].
    fn __deepcopy__(_slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(refuse_copy("copy.deepcopy"))
    }

    fn __repr__(&self) -> String {
        format!("Trace({} spans)", self.trace.len())
    }
}

fn refuse_copy(how: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "`{how}` cannot copy a `soma.Trace`: it is where runs record their spans, not a record\nhint: keep what it holds — `spans = trace.spans` (a list of immutable spans) or `trace.to_chrome()` — and pass a new `soma.Trace()` to later runs"
    ))
}
