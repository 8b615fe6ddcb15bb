//! `GraphCore` as Python sees it: the methods `soma.Graph` calls — adding nodes, steps and
//! edges, reading the topology, placing nodes and setting their policies, and running the graph
//! (`forward`, `aforward`).
//!
//! One `#[pymethods]` block, since `PyO3` takes one per class (without its `multiple-pymethods`
//! feature). The bookkeeping the methods share is in [`super`]; what the runs they start share
//! with streams and flows — the executor, the outcome in Python — is in [`super::run`].

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use pyo3::PyTraverseError;
use soma_core::{Decision, Device, Executor, Node, NodeId, Route, Setting};

use super::run::{executor_for, forward_on_loop, forward_outcome};
use super::{GraphCore, State};
use crate::aio;
use crate::stopped::time_limit;

use crate::context;
use crate::convert::wrap;
use crate::device_queues::Scope;
use crate::errors::{device_error, graph_error, unknown_node_error};
use crate::native::NativeNode;
use crate::node::PythonNode;
use crate::plan::PyPlan;
use crate::policy::{self, WrittenRetry};
use crate::reentry::Nested;
use crate::trace::PyTrace;
use crate::watch::{SignalWatch, StopFlag};

fn ids(list: Vec<&NodeId>) -> Vec<String> {
    list.into_iter().map(ToString::to_string).collect()
}

#[pymethods]
impl GraphCore {
    #[new]
    fn new() -> Self {
        GraphCore {
            state: Mutex::new(State::default()),
        }
    }

    /// Registers a Python object with a callable `forward` under `id`; an async node when
    /// `forward` is a coroutine function (`is_async`).
    #[pyo3(signature = (id, object, takes_ctx, is_async=false))]
    pub(super) fn add_python(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        takes_ctx: bool,
        is_async: bool,
    ) -> PyResult<()> {
        let forward = object
            .getattr(intern!(py, "forward"))
            .ok()
            .filter(PyAnyMethods::is_callable);
        let Some(forward) = forward else {
            return Err(PyTypeError::new_err(format!(
                "an object of type `{}` cannot be a node: it has no callable `forward`\nhint: subclass soma.Node and define `forward(self, x)`",
                object.get_type().name()?
            )));
        };
        let node = Arc::new(PythonNode::new(forward, takes_ctx, is_async)?);
        self.register(
            py,
            id,
            object,
            Arc::clone(&node) as Arc<dyn Node>,
            Some(node),
        )
    }

    /// Registers `object` under `id` as an `each` step: `body` runs on every item of the list
    /// the step reads, at most `in_flight` at once.
    #[pyo3(signature = (id, object, body, in_flight=None))]
    fn add_each(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        body: Bound<'_, GraphCore>,
        in_flight: Option<usize>,
    ) -> PyResult<()> {
        self.add_decision(py, id, object, vec![(None, body)], |mut graphs| {
            Decision::Map {
                body: graphs.pop().expect("one body").1,
                in_flight,
            }
        })
    }

    /// Registers `object` under `id` as a `switch` step: `object.forward` returns the key of
    /// the case to run, one of `cases`.
    fn add_switch(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        cases: Vec<(String, Bound<'_, GraphCore>)>,
    ) -> PyResult<()> {
        let cases = cases
            .into_iter()
            .map(|(key, case)| (Some(key), case))
            .collect();
        self.add_decision(py, id, object, cases, |cases| Decision::Switch { cases })
    }

    /// Registers `object` under `id` as a `loop` step: `body` runs until `object.forward` of
    /// its output is true, at most `max_iterations` times.
    fn add_loop(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        body: Bound<'_, GraphCore>,
        max_iterations: u32,
    ) -> PyResult<()> {
        self.add_decision(py, id, object, vec![(None, body)], |mut graphs| {
            Decision::Loop {
                body: graphs.pop().expect("one body").1,
                max_iterations,
            }
        })
    }

    /// Registers a Rust implementation under `id`; `object` is what `implementation(id)` returns.
    fn add_native(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        native: &Bound<'_, NativeNode>,
    ) -> PyResult<()> {
        self.register(py, id, object, native.get().implementation(), None)
    }

    fn add_edge(&self, py: Python<'_>, source: &str, target: &str) -> PyResult<()> {
        let mut state = self.state();
        state
            .graph
            .add_edge(source, target)
            .map_err(|e| graph_error(py, &e))?;
        state.compiled = None;
        Ok(())
    }

    fn nodes(&self) -> Vec<String> {
        self.state()
            .graph
            .nodes()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn edges(&self) -> Vec<(String, String)> {
        self.state()
            .graph
            .edges()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn roots(&self) -> Vec<String> {
        ids(self.state().graph.roots())
    }

    fn leaves(&self) -> Vec<String> {
        ids(self.state().graph.leaves())
    }

    fn predecessors(&self, py: Python<'_>, id: &str) -> PyResult<Vec<String>> {
        let state = self.state();
        Ok(ids(state
            .graph
            .predecessors(id)
            .map_err(|_| unknown_node_error(py, id, &state.graph))?))
    }

    fn successors(&self, py: Python<'_>, id: &str) -> PyResult<Vec<String>> {
        let state = self.state();
        Ok(ids(state
            .graph
            .successors(id)
            .map_err(|_| unknown_node_error(py, id, &state.graph))?))
    }

    fn topological_sort(&self) -> Vec<String> {
        self.state()
            .graph
            .topological_sort()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The Python object of node `id`: of this graph, or inside one of its decision steps
    /// (`chunks/clean`), found in the graph the step's sub-graph was copied from, level by
    /// level without recursion however deep steps nest.
    pub(crate) fn implementation(&self, py: Python<'_>, id: &str) -> PyResult<Py<PyAny>> {
        let mut within: Option<Py<GraphCore>> = None;
        let mut rest = id;
        loop {
            let core = within.as_ref().map_or(self, |body| body.get());
            let state = core.state();
            if let Some(at) = state.graph.position(rest) {
                return Ok(state.objects[at].clone_ref(py));
            }
            // No id holds the separator, so one body at most has a prefix `rest` is inside:
            // a step's, or a switch case's.
            let inside = state.bodies.iter().find_map(|(prefix, body)| {
                let inner = NodeId::within(rest, prefix.as_str())?;
                Some((inner, body.clone_ref(py)))
            });
            drop(state);
            let Some((inner, body)) = inside else {
                return Err(unknown_node_error(py, id, &self.state().graph));
            };
            rest = inner;
            within = Some(body);
        }
    }

    fn free_id(&self, base: &str) -> String {
        self.state().graph.free_id(base).to_string()
    }

    fn __len__(&self) -> usize {
        self.state().graph.len()
    }

    fn __contains__(&self, id: &str) -> bool {
        self.state().graph.contains(id)
    }

    /// Shows the garbage collector every Python object the graph holds, so that a graph kept by
    /// one of its own nodes (a cycle) can be collected. Skipped while another thread holds the
    /// lock: the collector then keeps the graph alive this time, which is safe.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(state) = self.state.try_lock() else {
            return Ok(());
        };
        for object in &state.objects {
            visit.call(object)?;
        }
        for node in &state.python_nodes {
            node.traverse(&visit)?;
        }
        for (_, body) in &state.bodies {
            visit.call(body)?;
        }
        Ok(())
    }

    /// Lets go of every Python object, breaking the cycle the collector found; the graph is
    /// being destroyed.
    fn __clear__(&self) {
        let cleared = std::mem::take(&mut *self.state());
        drop(cleared);
    }

    /// Threads the graph's program holds right now, busy or idle.
    fn threads(&self) -> usize {
        self.state()
            .compiled
            .as_ref()
            .and_then(|compiled| compiled.program.as_ref())
            .map_or(0, |program| program.threads())
    }

    /// How many idle threads the graph keeps for its waves.
    #[getter]
    fn idle_threads(&self) -> usize {
        self.state().idle_threads
    }

    #[setter]
    fn set_idle_threads(&self, limit: usize) {
        let mut state = self.state();
        state.idle_threads = limit;
        if let Some(program) = state.compiled.as_ref().and_then(|c| c.program.as_ref()) {
            program.set_idle_threads(limit);
        }
    }

    /// Refuses the next `count` threads the graph's program would start, as an operating
    /// system out of threads would: for tests of that path.
    fn _refuse_next_threads(&self, py: Python<'_>, count: usize) -> PyResult<()> {
        self.program(py)?.refuse_next_threads(count);
        Ok(())
    }

    /// The graph drawn as SVG, laid out with its plan (`soma_core::Graph::to_svg`), each placed
    /// node's box saying `id @ device`.
    fn to_svg(&self) -> String {
        let state = self.state();
        state.graph.with_devices(&state.placement).to_svg()
    }

    /// The plan, compiled on first use after a change, drawn with the nodes' devices, and
    /// with `cached` (node ids) marked as nodes a run would find in a cache when given.
    #[pyo3(signature = (cached=None))]
    fn plan(&self, py: Python<'_>, cached: Option<Vec<String>>) -> PyResult<PyPlan> {
        let plan = self.compiled_plan(py)?;
        let plan = PyPlan::new(plan, Arc::clone(&self.state().placement));
        Ok(match cached {
            Some(cached) => plan.with_cached(cached.into_iter().map(NodeId::new).collect()),
            None => plan,
        })
    }

    /// Places node `id` on `device` (torch's spelling), replacing where it was; `None`
    /// unplaces it. The plan stays; the program is resolved again on the next forward.
    #[pyo3(signature = (id, device))]
    fn place(&self, py: Python<'_>, id: &str, device: Option<&str>) -> PyResult<()> {
        let device = device
            .map(|text| text.parse::<Device>().map_err(|e| device_error(py, &e)))
            .transpose()?;
        let mut state = self.state();
        state.settable(py, id, device.is_some().then_some(Setting::Device))?;
        // In place unless a plan handed out still draws the placement it was given: placing
        // every node of a large graph one by one must not copy the whole placement each time.
        let placement = Arc::make_mut(&mut state.placement);
        match device {
            Some(device) => placement.place(id, device),
            None => placement.remove(id),
        };
        if let Some(compiled) = &mut state.compiled {
            compiled.program = None;
        }
        Ok(())
    }

    /// Runs node `id` on `host`, replacing where it ran; `None` brings it back here. A
    /// `soma.UnknownNodeError` for an unknown id, a `soma.HostError` for a step or a node
    /// inside one (it runs in this process) and for a name that cannot be a host's. Neither the
    /// plan nor the program changes: only the distribution step and the route read hosts.
    fn place_at(&self, py: Python<'_>, id: &str, host: Option<&str>) -> PyResult<()> {
        let mut state = self.state();
        state.settable(py, id, host.is_some().then_some(Setting::Host))?;
        match host {
            Some(host) => {
                let host = crate::hosts::read(py, host)?;
                state.hosts.place(id, host);
            }
            None => {
                state.hosts.remove(id);
            }
        }
        Ok(())
    }

    /// Nodes placed on hosts and their hosts, in the order the nodes were added.
    fn hosts(&self) -> Vec<(String, String)> {
        let state = self.state();
        if state.hosts.is_empty() {
            return Vec::new(); // The common case, with no walk of the catalog.
        }
        in_node_order(&state, |id| {
            state.hosts.host(id.as_str()).map(ToString::to_string)
        })
    }

    /// The plan cut into remote slices by the graph's hosts (`soma_core::distribute`): the
    /// plan itself when no node is on a host.
    fn distributed_plan(&self, py: Python<'_>) -> PyResult<PyPlan> {
        let plan = self.compiled_plan(py)?;
        let state = self.state();
        let distributed = soma_core::distribute(&plan, &state.hosts);
        Ok(PyPlan::new(
            Arc::new(distributed),
            Arc::clone(&state.placement),
        ))
    }

    /// Lets a stream run node `id` on up to `workers` items at once; `None` (or 1) takes them
    /// one at a time. A `soma.GraphError` for a node inside a step, which is no stage of a
    /// stream ([`soma_core::Decisions::refusal`]).
    fn set_concurrency(&self, py: Python<'_>, id: &str, workers: Option<usize>) -> PyResult<()> {
        // 1 is kept as any count is: an async node's concurrency unset follows the stream's
        // `in_flight` (the engine's `Limits`), and 1 then holds it to one item at a time.
        let mut state = self.state();
        state.settable(py, id, workers.map(|_| Setting::Concurrency))?;
        match workers {
            Some(workers) => state.concurrency.insert(NodeId::from(id), workers),
            None => state.concurrency.remove(id),
        };
        Ok(())
    }

    /// Nodes given a concurrency for a stream, and how many items at once, in the order the
    /// nodes were added.
    fn concurrencies(&self) -> Vec<(String, usize)> {
        let state = self.state();
        if state.concurrency.is_empty() {
            return Vec::new();
        }
        in_node_order(&state, |id| state.concurrency.get(id).copied())
    }

    /// How many items each node takes at once in one stream: the graph's own settings, each id
    /// in `asked` set to its count for this stream instead, in the order the nodes were added.
    /// An id in `asked` is refused as [`GraphCore::set_concurrency`] refuses it, with the same
    /// errors, so that a stream's `concurrency={...}` and `g.concurrency` hold one rule.
    fn stream_concurrency(
        &self,
        py: Python<'_>,
        asked: Vec<(String, usize)>,
    ) -> PyResult<Vec<(String, usize)>> {
        let state = self.state();
        if asked.is_empty() && state.concurrency.is_empty() {
            return Ok(Vec::new());
        }
        let mut workers = state.concurrency.clone();
        for (id, count) in asked {
            state.settable(py, &id, Some(Setting::Concurrency))?;
            workers.insert(NodeId::from(id), count);
        }
        Ok(in_node_order(&state, |id| workers.get(id).copied()))
    }

    /// The runner a call takes ([`soma_core::Route`]): `engine` or `hosts` for one run,
    /// `stream` or `flow` for a stream (`streamed`); a `ValueError` for a stream of a graph
    /// with hosts.
    fn route<'py>(&self, py: Python<'py>, streamed: bool) -> PyResult<&Bound<'py, PyString>> {
        let on_a_host = {
            let state = self.state();
            if state.hosts.is_empty() {
                None
            } else {
                state.catalog.iter().find_map(|(id, _)| {
                    let host = state.hosts.host(id.as_str())?;
                    Some((id.clone(), host.clone()))
                })
            }
        };
        // Whether the graph holds an async node is the program's to say, asked only of a
        // stream without hosts: compiled then, as the stream is about to compile it anyway.
        let mut unresolved = None;
        let route = Route::of(streamed, on_a_host, || match self.program(py) {
            Ok(program) => program.is_async(),
            Err(failure) => {
                unresolved = Some(failure);
                false
            }
        });
        if let Some(failure) = unresolved {
            return Err(failure);
        }
        // Interned: asked on every forward, the answer is never a new string.
        match route.map_err(|refused| PyValueError::new_err(refused.to_string()))? {
            Route::Engine => Ok(intern!(py, "engine")),
            Route::Hosts => Ok(intern!(py, "hosts")),
            Route::Stream => Ok(intern!(py, "stream")),
            Route::Flow => Ok(intern!(py, "flow")),
        }
    }

    /// Retries node `id`'s failing calls `times` more times, the first after `backoff`
    /// seconds, only for exceptions of the types in `on`; `times=None` removes its retries.
    #[pyo3(signature = (id, times, backoff=0.5, on=None))]
    fn set_retry(
        &self,
        py: Python<'_>,
        id: &str,
        times: Option<u32>,
        backoff: f64,
        on: Option<Py<PyTuple>>,
    ) -> PyResult<()> {
        let written = match times {
            Some(times) => {
                let on = on.ok_or_else(|| PyTypeError::new_err("a retry needs `on`"))?;
                let retry = policy::retry(py, times, backoff, &on)?;
                Some((retry, (times, backoff, on)))
            }
            None => None,
        };
        let mut state = self.state();
        state.settable(py, id, written.is_some().then_some(Setting::Retry))?;
        let policies = &mut state.policies;
        if let Some((retry, written)) = written {
            policies.policies.set_retry(id, Some(retry));
            policies.retries.insert(id.to_owned(), written);
        } else {
            policies.policies.set_retry(id, None);
            policies.retries.remove(id);
        }
        if let Some(compiled) = &mut state.compiled {
            compiled.program = None;
        }
        Ok(())
    }

    /// Fails node `id`'s calls that run past `seconds` with a `soma.TimeLimitError`; `None`
    /// removes its limit.
    fn set_time_limit(&self, py: Python<'_>, id: &str, seconds: Option<f64>) -> PyResult<()> {
        let limit = seconds
            .map(|seconds| {
                crate::seconds::as_duration(seconds).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "time_limit takes a number of seconds above 0, not {seconds}"
                    ))
                })
            })
            .transpose()?;
        let mut state = self.state();
        state.settable(py, id, limit.is_some().then_some(Setting::TimeLimit))?;
        let policies = &mut state.policies;
        policies.policies.set_time_limit(id, limit);
        match seconds {
            Some(seconds) => policies.time_limits.insert(id.to_owned(), seconds),
            None => policies.time_limits.remove(id),
        };
        if let Some(compiled) = &mut state.compiled {
            compiled.program = None;
        }
        Ok(())
    }

    /// Nodes with retries, and their `(times, backoff, on)`, in the order the nodes were added.
    fn retries(&self, py: Python<'_>) -> Vec<(String, WrittenRetry)> {
        let state = self.state();
        in_node_order(&state, |id| {
            let (times, backoff, on) = state.policies.retries.get(id.as_str())?;
            Some((*times, *backoff, on.clone_ref(py)))
        })
    }

    /// Nodes with a time limit, and its seconds, in the order the nodes were added.
    fn time_limits(&self) -> Vec<(String, f64)> {
        let state = self.state();
        in_node_order(&state, |id| {
            state.policies.time_limits.get(id.as_str()).copied()
        })
    }

    /// Placed nodes and their devices, in the order the nodes were added.
    fn devices(&self) -> Vec<(String, String)> {
        let state = self.state();
        in_node_order(&state, |id| {
            state.placement.device(id.as_str()).map(|d| d.to_string())
        })
    }

    /// For each node, in plan order, whether a forward on `input` with `cache` (a
    /// `soma.Cache`) would find its output there; no node runs.
    fn would_hit(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        input: Bound<'_, PyAny>,
        cache: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(String, bool)>> {
        let program = slf.get().program(py)?;
        let executor = Executor::new().with_cache(Arc::new(GraphCore::run_cache(slf, cache)?));
        let found = executor.would_hit(&program, &wrap(input));
        Ok(found
            .into_iter()
            .map(|(id, hit)| (id.to_string(), hit))
            .collect())
    }

    /// Runs the graph on `input`, with `cache` (a `soma.Cache`) when given: on the engine
    /// here, or through `soma.remote` when a node is on a host ([`Route::of_one_run`]), for
    /// which `graph`, the `soma.Graph` this core is of, is needed.
    #[pyo3(signature = (input, driver=None, turn_limit=soma_core::DEFAULT_TURN_LIMIT, trace=None, timeout=None, stop=None, cache=None, graph=None))]
    #[allow(clippy::too_many_arguments)] // `forward`'s own keywords, each passed through.
    fn forward<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        input: Bound<'py, PyAny>,
        driver: Option<&Bound<'py, PyAny>>,
        turn_limit: u32,
        trace: Option<&Bound<'py, PyTrace>>,
        timeout: Option<f64>,
        stop: Option<&Bound<'py, StopFlag>>,
        cache: Option<&Bound<'py, PyAny>>,
        graph: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        let call = (&input, driver, turn_limit, trace, timeout, cache);
        if let Some(on_hosts) = this.on_hosts(py, intern!(py, "forward"), graph, call)? {
            return Ok(on_hosts);
        }
        // This thread one level deeper until the run returns; its executor's host carries it.
        let _nested = Nested::enter()?;
        let timeout = timeout.map(time_limit).transpose()?;
        let program = this.program(py)?;
        let watch = Arc::new(SignalWatch::new(timeout, stop.map(Bound::get)));
        let executor = executor_for(
            &program, true, slf, &watch, driver, turn_limit, trace, cache,
        )?;
        let input = wrap(input);
        if program.is_async() {
            return forward_on_loop(py, &program, &executor, input, &watch, timeout);
        }
        // The whole run in a copy of the caller's context, as each branch is in a copy of its
        // wave's: what the nodes set never reaches the caller, with or without a wave.
        let (mut input, mut outcome) = (Some(input), None);
        let mut run = || {
            let input = input.take().expect("the graph runs once");
            outcome = Some(panic::catch_unwind(AssertUnwindSafe(|| {
                executor.run_detachable(&program, input)
            })));
        };
        let queues = Scope::for_forward(py, program.devices());
        context::isolated(&mut run);
        drop(queues);
        forward_outcome(
            py,
            outcome.expect("the context ran the graph"),
            &watch,
            timeout,
        )
    }

    /// Runs the graph on `input` from a running event loop: the awaitable `aforward` awaits,
    /// the run walked by the engine in the caller's task, its async nodes' coroutines stepped
    /// there, its branches tasks of their own on this loop; or, as `forward` routes it, the
    /// coroutine `soma.remote` awaits the hosts with.
    #[pyo3(signature = (input, driver=None, turn_limit=soma_core::DEFAULT_TURN_LIMIT, trace=None, timeout=None, cache=None, graph=None))]
    #[allow(clippy::too_many_arguments)] // `aforward`'s own keywords, each passed through.
    fn aforward<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        input: Bound<'py, PyAny>,
        driver: Option<&Bound<'py, PyAny>>,
        turn_limit: u32,
        trace: Option<&Bound<'py, PyTrace>>,
        timeout: Option<f64>,
        cache: Option<&Bound<'py, PyAny>>,
        graph: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        let call = (&input, driver, turn_limit, trace, timeout, cache);
        if let Some(on_hosts) = this.on_hosts(py, intern!(py, "aforward"), graph, call)? {
            return Ok(on_hosts);
        }
        let timeout = timeout.map(time_limit).transpose()?;
        crate::reentry::Stepping::check_aforward()?;
        let Some(event_loop) = aio::running_loop(py)? else {
            return Err(PyRuntimeError::new_err(
                "aforward was called with no running event loop\nhint: `await g.aforward(x)` inside a coroutine, or call `g.forward(x)`",
            ));
        };
        let program = this.program(py)?;
        let watch = Arc::new(SignalWatch::new(timeout, None));
        let executor = executor_for(
            &program, true, slf, &watch, driver, turn_limit, trace, cache,
        )?;
        let tasks = aio::LoopTasks::new(event_loop.unbind());
        let (task, settled) = executor.start(
            &program,
            wrap(input),
            Arc::clone(&tasks) as Arc<dyn soma_core::Tasks>,
        );
        let stepper = tasks.root(py, task, settled, watch, timeout)?;
        Ok(Bound::new(py, stepper)?.into_any())
    }
}

/// What a call that runs once passes on, as `forward` and `aforward` take it: the input, the
/// driver, the turn limit, the trace, the timeout and the cache.
type OneRun<'a, 'py> = (
    &'a Bound<'py, PyAny>,
    Option<&'a Bound<'py, PyAny>>,
    u32,
    Option<&'a Bound<'py, PyTrace>>,
    Option<f64>,
    Option<&'a Bound<'py, PyAny>>,
);

impl GraphCore {
    /// The run of `call` when the core routes it to the hosts ([`Route::of_one_run`]):
    /// `soma.remote`'s `runner` (`forward`, or `aforward`, which makes a coroutine) on `graph`,
    /// the `soma.Graph` this core is of, its slices on their hosts and the rest here through a
    /// core of its own. `None` when the engine here takes the call.
    fn on_hosts<'py>(
        &self,
        py: Python<'py>,
        runner: &Bound<'py, PyString>,
        graph: Option<&Bound<'py, PyAny>>,
        call: OneRun<'_, 'py>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.one_run_route() {
            Route::Engine => Ok(None),
            Route::Hosts => {
                let Some(graph) = graph else {
                    return Err(PyRuntimeError::new_err(
                        "a core with nodes on hosts was run without its graph\nhint: run it with `Graph.forward`",
                    ));
                };
                let (input, driver, turn_limit, trace, timeout, cache) = call;
                let runner = crate::py_modules::remote(py)?.getattr(runner)?;
                let arguments = (graph, input, driver, turn_limit, trace, timeout, cache);
                Ok(Some(runner.call1(arguments)?))
            }
            Route::Stream | Route::Flow => unreachable!("a call that runs once never streams"),
        }
    }
}

/// What `pick` says of each node that it says something of, by id, in the order the nodes were
/// added: the listings of what is set per node (devices, hosts, retries, time limits,
/// concurrency).
///
/// Read through the catalog, whose order is the graph's, so that the nodes inside `each`,
/// `switch` and `loop` steps are listed too (`chunks/clean`), each before its step.
fn in_node_order<T>(state: &State, pick: impl Fn(&NodeId) -> Option<T>) -> Vec<(String, T)> {
    state
        .catalog
        .iter()
        .filter_map(|(id, _)| Some((id.to_string(), pick(id)?)))
        .collect()
}
