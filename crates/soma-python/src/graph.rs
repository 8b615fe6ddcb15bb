//! `soma._soma.GraphCore`: a graph, its implementations and its cached plan, behind one lock.
//!
//! The Python `soma.Graph` wraps this class and adds what is easier said in Python (derived ids,
//! the DSL). The lock is held only for bookkeeping, always with the GIL held and never across a
//! run: `forward` takes the compiled program (behind an `Arc`) and runs without the lock, so
//! several Python threads can run one graph at once while another edits it.
//!
//! A run keeps the GIL from one Python node to the next on the same thread — taking and giving
//! it back around every node would cost more than a small node itself — and gives it back
//! wherever the engine blocks (joining a wave, calling the driver) and around every Rust node
//! ([`crate::native`]). Branch threads take it for their whole branch, on the same terms; the
//! interpreter's own switch interval lets the branches of a wave take turns.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3::PyTraverseError;
use soma_core::{
    compile_decided, Captured, Catalog, Decision, Decisions, Device, Executor, Graph, Host, Node,
    NodeId, Placement, Plan, Program, Reading, RunError, Setting, Watch, DEFAULT_IDLE_THREADS,
};

use crate::aio::{self, Stepper};
use crate::cache::PythonCache;
use crate::context;
use crate::convert::{to_python, wrap};
use crate::device_queues::Scope;
use crate::driver::PythonDriver;
use crate::errors::{
    cancelled_error, compile_error, device_error, graph_error, panic_error, program_error,
    run_error, taken_inside_a_step, unknown_node_error,
};
use crate::exit;
use crate::native::NativeNode;
use crate::node::PythonNode;
use crate::plan::PyPlan;
use crate::policy::{self, Written, WrittenRetry};
use crate::reading::PythonReading;
use crate::reentry::{self, Nested, MAX_NESTED_FORWARDS};
use crate::thread_state;
use crate::trace::PyTrace;
use crate::watch::{SignalWatch, StopFlag};

struct State {
    graph: Graph,
    catalog: Catalog,
    /// The registered Python objects, for `implementation(id)`, in the graph's order: looked up
    /// through the graph's index rather than a table of their own, one hash less per node.
    objects: Vec<Py<PyAny>>,
    /// The Python nodes in the catalog, kept apart so that the garbage collector can be shown
    /// the references they hold (a node that keeps its own graph makes a cycle).
    python_nodes: Vec<Arc<PythonNode>>,
    /// Compiled on first use after a change.
    compiled: Option<Compiled>,
    /// How many idle threads the program keeps.
    idle_threads: usize,
    /// Where nodes run; beside the graph, so placing one drops the program, never the plan.
    placement: Arc<Placement>,
    /// Retries and time limits, by node; like the placement, setting one drops the program.
    policies: Written,
    /// The `each`, `switch` and `loop` steps and the sub-graphs they run, whose nodes are in
    /// the catalog under ids namespaced by the step's (`chunks/clean`).
    decisions: Decisions,
    /// The graphs those sub-graphs were copied from, each with the prefix its ids were
    /// namespaced under: kept for the Python objects they hold, which a node inside is found
    /// by ([`GraphCore::implementation`]).
    bodies: Vec<(String, Py<GraphCore>)>,
}

impl State {
    /// Whether `setting` may be written on node `id`: an unknown id is a
    /// `soma.UnknownNodeError`, and a setting the id cannot take ([`Decisions::refusal`]) is
    /// refused with the core's reason. `None` for a setting removed, which any known id takes.
    fn settable(&self, py: Python<'_>, id: &str, setting: Option<Setting>) -> PyResult<()> {
        // A node inside a decision step is in the catalog only (`chunks/clean`).
        if !self.catalog.contains(id) {
            return Err(unknown_node_error(py, id, &self.graph));
        }
        match setting.and_then(|setting| self.decisions.refusal(id, setting)) {
            Some(refused) => Err(crate::errors::setting_error(py, &refused)),
            None => Ok(()),
        }
    }
}

impl Default for State {
    fn default() -> Self {
        State {
            graph: Graph::default(),
            catalog: Catalog::default(),
            objects: Vec::new(),
            python_nodes: Vec::new(),
            compiled: None,
            idle_threads: DEFAULT_IDLE_THREADS,
            placement: Arc::default(),
            policies: Written::default(),
            decisions: Decisions::default(),
            bodies: Vec::new(),
        }
    }
}

/// A plan, and the program that runs it once a forward has asked for one: `plan()` alone
/// never pays for resolving a program.
struct Compiled {
    plan: Arc<Plan>,
    program: Option<Arc<Program>>,
}

#[pyclass(frozen, module = "soma._soma")]
pub struct GraphCore {
    state: Mutex<State>,
}

impl GraphCore {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic never happens while the lock is held; if one did, the state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        implementation: Arc<dyn Node>,
        python_node: Option<Arc<PythonNode>>,
    ) -> PyResult<()> {
        let mut state = self.state();
        // Only a step's nodes are in the catalog and not in the graph, and their ids hold a `/`:
        // an id without one is not looked up (a lookup in a large catalog misses the caches).
        if id.contains('/') && state.catalog.contains(id) && !state.graph.contains(id) {
            return Err(taken_inside_a_step(py, id));
        }
        let id = state
            .graph
            .add_node(id)
            .map_err(|e| graph_error(py, &e))?
            .clone();
        state.catalog.insert(id, implementation);
        state.objects.push(object.clone().unbind());
        state.python_nodes.extend(python_node);
        state.compiled = None;
        Ok(())
    }

    /// Copies `body` into this graph's catalog, placement, policies and decisions, every id
    /// namespaced under `step`'s (`step/id`), and returns its topology so namespaced: the
    /// sub-graph a decision step runs.
    fn embed(&self, py: Python<'_>, step: &str, body: &Bound<'_, GraphCore>) -> PyResult<Graph> {
        if std::ptr::eq(self, body.get()) {
            return Err(PyValueError::new_err(
                "a graph cannot run itself as a step of its own",
            ));
        }
        let inner = body.get().state();
        let named = |id: &str| format!("{step}/{id}");
        let mut graph = Graph::new();
        for id in inner.graph.nodes() {
            graph
                .add_node(named(id.as_str()))
                .map_err(|e| graph_error(py, &e))?;
        }
        for (source, target) in inner.graph.edges() {
            graph
                .add_edge(&named(source.as_str()), &named(target.as_str()))
                .map_err(|e| graph_error(py, &e))?;
        }
        let mut state = self.state();
        // Refused before anything is copied: a node of this graph, or of a step of it, already
        // holds one of the names the body's nodes take here.
        if let Some(taken) = inner
            .catalog
            .iter()
            .map(|(id, _)| named(id.as_str()))
            .find(|id| state.catalog.contains(id) || state.graph.contains(id))
        {
            return Err(taken_inside_a_step(py, &taken));
        }
        // Its whole catalog: its own nodes' and those of the decisions it holds in turn.
        for (id, implementation) in inner.catalog.iter() {
            state
                .catalog
                .insert(named(id.as_str()), Arc::clone(implementation));
            if let Some(device) = inner.placement.device(id.as_str()) {
                Arc::make_mut(&mut state.placement).place(named(id.as_str()), device);
            }
        }
        for (id, (times, backoff, on)) in &inner.policies.retries {
            let retry = policy::retry(py, *times, *backoff, on)?;
            state.policies.policies.set_retry(&named(id), Some(retry));
            state
                .policies
                .retries
                .insert(named(id), (*times, *backoff, on.clone_ref(py)));
        }
        for (id, seconds) in &inner.policies.time_limits {
            let limit = Duration::try_from_secs_f64(*seconds)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            state
                .policies
                .policies
                .set_time_limit(&named(id), Some(limit));
            state.policies.time_limits.insert(named(id), *seconds);
        }
        for (id, decision) in inner.decisions.iter() {
            let renamed = |graph: &Graph| -> PyResult<Graph> {
                let mut copy = Graph::new();
                for node in graph.nodes() {
                    copy.add_node(named(node.as_str()))
                        .map_err(|e| graph_error(py, &e))?;
                }
                for (source, target) in graph.edges() {
                    copy.add_edge(&named(source.as_str()), &named(target.as_str()))
                        .map_err(|e| graph_error(py, &e))?;
                }
                Ok(copy)
            };
            let decision = match decision {
                Decision::Map { body, in_flight } => Decision::Map {
                    body: renamed(body)?,
                    in_flight: *in_flight,
                },
                Decision::Loop {
                    body,
                    max_iterations,
                } => Decision::Loop {
                    body: renamed(body)?,
                    max_iterations: *max_iterations,
                },
                Decision::Switch { cases } => Decision::Switch {
                    cases: cases
                        .iter()
                        .map(|(key, case)| Ok((key.clone(), renamed(case)?)))
                        .collect::<PyResult<_>>()?,
                },
            };
            state.decisions.insert(named(id), decision);
        }
        state
            .python_nodes
            .extend(inner.python_nodes.iter().cloned());
        drop(inner);
        state.bodies.push((step.to_owned(), body.clone().unbind()));
        state.compiled = None;
        Ok(graph)
    }

    /// Registers `object` under `id` as a decision step whose node is `object`'s `forward`
    /// (the selector of a `switch`, the predicate of a `loop`), running `bodies`.
    fn add_decision(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        bodies: Vec<(String, Bound<'_, GraphCore>)>,
        decide: impl FnOnce(Vec<(String, Graph)>) -> Decision,
    ) -> PyResult<()> {
        if self.state().graph.contains(id) {
            // Refused before anything is copied, as `add_python` would refuse it.
            self.add_python(py, id, object, false, false)?;
        }
        let mut graphs = Vec::with_capacity(bodies.len());
        for (key, body) in bodies {
            // A switch's cases are namespaced by key too: two may hold a node of one name.
            let prefix = if key.is_empty() {
                id.to_owned()
            } else {
                format!("{id}/{key}")
            };
            let graph = self.embed(py, &prefix, &body)?;
            graphs.push((key, graph));
        }
        // Its `forward` reads `ctx`, for the step's id in what it raises; an async selector
        // or predicate makes it async.
        let is_async = is_coroutine_function(py, &object.getattr(intern!(py, "forward"))?)?;
        self.add_python(py, id, object, true, is_async)?;
        self.state().decisions.insert(id, decide(graphs));
        Ok(())
    }

    /// The plan, compiled on first use after a change.
    fn compiled_plan(&self, py: Python<'_>) -> PyResult<Arc<Plan>> {
        let mut state = self.state();
        Ok(Arc::clone(&Self::compiled(py, &mut state)?.plan))
    }

    /// The program, resolved on first use after a change.
    pub(crate) fn program(&self, py: Python<'_>) -> PyResult<Arc<Program>> {
        let mut state = self.state();
        Self::compiled(py, &mut state)?;
        let State {
            catalog,
            compiled,
            idle_threads,
            placement,
            policies,
            ..
        } = &mut *state;
        let compiled = compiled.as_mut().expect("compiled just now");
        if let Some(program) = &compiled.program {
            return Ok(Arc::clone(program));
        }
        let program = Program::resolved(&compiled.plan, catalog, placement, &policies.policies)
            .map_err(|e| program_error(py, &e))?;
        program.set_idle_threads(*idle_threads);
        program.set_thread_stack(thread_stack_asked(py));
        let program = Arc::new(program);
        compiled.program = Some(Arc::clone(&program));
        Ok(program)
    }

    fn compiled<'s>(py: Python<'_>, state: &'s mut State) -> PyResult<&'s mut Compiled> {
        if state.compiled.is_none() {
            let plan = compile_decided(&state.graph, &state.catalog, &state.decisions)
                .map_err(|e| compile_error(py, &e))?;
            state.compiled = Some(Compiled {
                plan: Arc::new(plan),
                program: None,
            });
        }
        Ok(state.compiled.as_mut().expect("compiled just now"))
    }
}

/// What `threading.stack_size()` asks of Python's own threads, which a crew thread gets too; 0
/// when nothing is asked. The function is looked up once: importing `threading` again for each
/// program cost a first forward about 15 µs.
pub(crate) fn thread_stack_asked(py: Python<'_>) -> usize {
    static STACK_SIZE: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();
    STACK_SIZE
        .get_or_init(py, || {
            py.import("threading")
                .and_then(|threading| threading.getattr("stack_size"))
                .ok()
                .map(Bound::unbind)
        })
        .as_ref()
        .and_then(|stack_size| stack_size.call0(py).ok())
        .and_then(|size| size.extract(py).ok())
        .unwrap_or(0)
}

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
    fn add_python(
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
        self.add_decision(py, id, object, vec![(String::new(), body)], |mut graphs| {
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
        self.add_decision(py, id, object, vec![(String::new(), body)], |mut graphs| {
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
            // The longest prefix: a step `a` and a node `a/b` of the same graph both prefix
            // `a/b/c`.
            let inside = state
                .bodies
                .iter()
                .filter_map(|(prefix, body)| {
                    let inner = rest.strip_prefix(prefix.as_str())?.strip_prefix('/')?;
                    Some((inner.len(), body))
                })
                .min_by_key(|&(len, _)| len)
                .map(|(len, body)| (len, body.clone_ref(py)));
            drop(state);
            let Some((len, body)) = inside else {
                return Err(unknown_node_error(py, id, &self.state().graph));
            };
            rest = &rest[rest.len() - len..];
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

    /// Whether node `id` may be placed on a host: a `soma.UnknownNodeError` for an unknown id,
    /// a `soma.HostError` for a step or a node inside one (it runs in this process).
    fn check_host(&self, py: Python<'_>, id: &str) -> PyResult<()> {
        self.state().settable(py, id, Some(Setting::Host))
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
                Duration::try_from_secs_f64(seconds)
                    .map_err(|e| PyValueError::new_err(e.to_string()))
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

    /// For each node, in plan order, whether a forward on `input` with `cache` (a run cache of
    /// `soma/cache/_cache.py`) would find its output there; no node runs.
    fn would_hit(
        &self,
        py: Python<'_>,
        input: Bound<'_, PyAny>,
        cache: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(String, bool)>> {
        let program = self.program(py)?;
        let executor = Executor::new().with_cache(Arc::new(PythonCache::new(cache)));
        let found = executor.would_hit(&program, &wrap(input));
        Ok(found
            .into_iter()
            .map(|(id, hit)| (id.to_string(), hit))
            .collect())
    }

    /// Runs the graph on `input`.
    #[pyo3(signature = (input, driver=None, turn_limit=soma_core::DEFAULT_TURN_LIMIT, trace=None, timeout=None, stop=None, cache=None))]
    #[allow(clippy::too_many_arguments)] // `forward`'s own keywords, each passed through.
    fn forward<'py>(
        &self,
        py: Python<'py>,
        input: Bound<'py, PyAny>,
        driver: Option<&Bound<'py, PyAny>>,
        turn_limit: u32,
        trace: Option<&Bound<'py, PyTrace>>,
        timeout: Option<f64>,
        stop: Option<&Bound<'py, StopFlag>>,
        cache: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let nested = Nested::enter()?;
        let timeout = timeout.map(time_limit).transpose()?;
        let program = self.program(py)?;
        let watch = Arc::new(SignalWatch::new(timeout, stop.map(Bound::get)));
        let mut executor =
            executor_for(&program, nested.depth(), &watch, driver, turn_limit, trace)?;
        if let Some(cache) = cache {
            executor = executor.with_cache(Arc::new(PythonCache::new(cache)));
        }
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
    /// there, its branches tasks of their own on this loop.
    #[pyo3(signature = (input, driver=None, turn_limit=soma_core::DEFAULT_TURN_LIMIT, trace=None, timeout=None, cache=None))]
    #[allow(clippy::too_many_arguments)] // `aforward`'s own keywords, each passed through.
    fn aforward<'py>(
        &self,
        py: Python<'py>,
        input: Bound<'py, PyAny>,
        driver: Option<&Bound<'py, PyAny>>,
        turn_limit: u32,
        trace: Option<&Bound<'py, PyTrace>>,
        timeout: Option<f64>,
        cache: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Stepper> {
        let timeout = timeout.map(time_limit).transpose()?;
        let Some(event_loop) = aio::running_loop(py)? else {
            return Err(PyRuntimeError::new_err(
                "aforward was called with no running event loop\nhint: `await g.aforward(x)` inside a coroutine, or call `g.forward(x)`",
            ));
        };
        let program = self.program(py)?;
        let watch = Arc::new(SignalWatch::new(timeout, None));
        let mut executor = executor_for(
            &program,
            reentry::depth(),
            &watch,
            driver,
            turn_limit,
            trace,
        )?;
        if let Some(cache) = cache {
            executor = executor.with_cache(Arc::new(PythonCache::new(cache)));
        }
        let tasks = aio::LoopTasks::new(event_loop.unbind());
        let (task, settled) = executor.start(
            &program,
            wrap(input),
            Arc::clone(&tasks) as Arc<dyn soma_core::Tasks>,
        );
        tasks.root(py, task, settled, watch, timeout)
    }
}

/// What `forward` returns or raises for a run's `outcome`: its result, or its error — a
/// `TimeoutError` past its timeout, a `soma.CancelledError` when its stop flag stopped it, a
/// node's own exception — or a `soma.PanicError`.
fn forward_outcome<'py>(
    py: Python<'py>,
    outcome: std::thread::Result<Result<soma_core::Value, RunError>>,
    watch: &SignalWatch,
    timeout: Option<Duration>,
) -> PyResult<Bound<'py, PyAny>> {
    match outcome {
        Ok(Ok(value)) => to_python(py, &value),
        Ok(Err(error)) if watch.timed_out() || matches!(error, RunError::PastDeadline) => {
            Err(timed_out(&error, timeout))
        }
        // A node's own error, met before the flag was seen, is the run's, as it would be
        // without the flag.
        Ok(Err(
            error @ (RunError::Interrupted
            | RunError::Abandoned { .. }
            | RunError::Cancelled { .. }),
        )) if watch.cancelled() => Err(cancelled(py, &error)),
        Ok(Err(error)) => Err(run_error(py, &error, watch.take_raised())),
        Err(payload) => Err(panic_error(py, &*payload)),
    }
}

/// Refuses `what` (`forward`, a stream) of `program`, which has async nodes, on a thread whose
/// event loop is running: it would block the loop, and the nodes could never run on it.
pub(crate) fn refuse_inside_loop(py: Python<'_>, what: &str, program: &Program) -> PyResult<()> {
    if aio::running_loop(py)?.is_none() {
        return Ok(());
    }
    let node = program
        .first_async()
        .map(|node| node.to_string())
        .unwrap_or_default();
    Err(PyRuntimeError::new_err(format!(
        "{what} of a graph with async nodes (`{node}`) was called inside a running event loop, which it would block\nhint: `await g.aforward(x)` runs the graph on this loop without blocking it"
    )))
}

/// Whether `function` is a coroutine function (`async def`).
fn is_coroutine_function(py: Python<'_>, function: &Bound<'_, PyAny>) -> PyResult<bool> {
    static CHECK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    CHECK
        .import(py, "inspect", "iscoroutinefunction")?
        .call1((function,))?
        .is_truthy()
}

/// How often a caller waiting for a run on the kept loop looks for signals and its deadline.
const WAIT_SLICE: Duration = Duration::from_millis(5);

/// How long the caller lets a run it stopped reach its node boundaries before it stops
/// waiting for the nodes that do not, as a sync run's caller does.
const STOP_GRACE: Duration = Duration::from_millis(50);

/// `forward` of a graph with async nodes: the run started as a task on the event loop Soma
/// keeps for the process (`soma._run.loop.kept_loop`), in a copy of the caller's context, while the
/// caller waits on the run's outcome — never on the loop — a few milliseconds at a time,
/// looking for Ctrl-C and its deadline between. Stopped (Ctrl-C, the deadline, the stop flag),
/// the run is cancelled; what has not stopped after a short grace is left to finish, its
/// result dropped, and `forward` raises at once, whatever a node does on the loop.
fn forward_on_loop<'py>(
    py: Python<'py>,
    program: &Arc<Program>,
    executor: &Executor,
    input: soma_core::Value,
    watch: &Arc<SignalWatch>,
    timeout: Option<Duration>,
) -> PyResult<Bound<'py, PyAny>> {
    refuse_inside_loop(py, "forward", program)?;
    let event_loop = py
        .import("soma._run.loop")?
        .getattr(intern!(py, "kept_loop"))?
        .call0()?;
    let tasks = aio::LoopTasks::new(event_loop.clone().unbind());
    let (task, settled) = executor.start(
        program,
        input,
        Arc::clone(&tasks) as Arc<dyn soma_core::Tasks>,
    );
    let started = py
        .import("soma._run.loop")?
        .getattr(intern!(py, "start"))?
        .call1((&event_loop, tasks.background(task)))?;
    // When the watch stopped the run, and what was running then.
    let mut stopped: Option<(std::time::Instant, Vec<NodeId>)> = None;
    loop {
        if py.detach(|| settled.wait(WAIT_SLICE)) {
            break;
        }
        watch.poll();
        if !watch.interrupted() {
            continue;
        }
        let (since, running) = stopped.get_or_insert_with(|| {
            // Stopped: the run's tasks are cancelled, their async nodes' calls interrupted.
            let running = settled.running();
            let _ = started.call_method0(intern!(py, "cancel"));
            (std::time::Instant::now(), running)
        });
        if since.elapsed() >= STOP_GRACE {
            let error = RunError::Cancelled {
                running: std::mem::take(running),
            };
            return forward_outcome(py, Ok(Err(error)), watch, timeout);
        }
    }
    let outcome = settled.take().expect("a run that is done has settled");
    let outcome = match (stopped, outcome) {
        // What a run stopped by its watch ends with is the stop's doing — a node's own
        // `CancelledError` among it — unless a node failed for a reason of its own.
        (Some((_, running)), Ok(Err(error))) if stopped_by_cancel(py, &error) => {
            Ok(Err(RunError::Cancelled { running }))
        }
        (_, outcome) => outcome,
    };
    forward_outcome(py, outcome, watch, timeout)
}

/// Whether `error` is what cancelling a run leaves: its branches stopped at a boundary, or an
/// async node's call ended by the `CancelledError` thrown into it.
fn stopped_by_cancel(py: Python<'_>, error: &RunError) -> bool {
    match error {
        RunError::Interrupted | RunError::Cancelled { .. } | RunError::Abandoned { .. } => true,
        RunError::NodeFailed { error, .. } => error
            .cause()
            .and_then(|cause| cause.downcast_ref::<PyErr>())
            .is_some_and(|raised| {
                py.import("asyncio")
                    .and_then(|asyncio| asyncio.getattr("CancelledError"))
                    .is_ok_and(|cancelled| raised.is_instance(py, &cancelled))
            }),
        RunError::Retried { last, .. } => stopped_by_cancel(py, last),
        RunError::NoDriver { .. }
        | RunError::DriverFailed { .. }
        | RunError::WrongResultCount { .. }
        | RunError::TurnLimit { .. }
        | RunError::Invalid(_)
        | RunError::NoThread { .. }
        | RunError::NoTask { .. }
        | RunError::TimeLimit { .. }
        | RunError::NotAList { .. }
        | RunError::UnknownCase { .. }
        | RunError::LoopLimit { .. }
        | RunError::NeedsLoop { .. }
        | RunError::PastDeadline => false,
    }
}

/// The executor of a forward or a stream of `program`: `forward`'s own arguments, the run's
/// watch, the interpreter as host at the run's nesting depth, and the reading of Python values
/// when the program has steps that decide.
pub(crate) fn executor_for(
    program: &Program,
    depth: usize,
    watch: &Arc<SignalWatch>,
    driver: Option<&Bound<'_, PyAny>>,
    turn_limit: u32,
    trace: Option<&Bound<'_, PyTrace>>,
) -> PyResult<Executor> {
    let mut executor = Executor::new()
        .with_turn_limit(turn_limit)
        .with_watch(Arc::clone(watch) as Arc<dyn soma_core::Watch>)
        .with_host(interpreter_at(depth));
    // Only a program that decides reads values through it: any other runs as it did.
    if program.decides() {
        executor = executor.with_reading(python_reading());
    }
    if let Some(driver) = driver {
        executor = executor.with_driver(Arc::new(PythonDriver::new(driver)?));
    }
    if let Some(trace) = trace {
        executor = executor.with_trace(Arc::clone(&trace.get().trace));
    }
    if let Some(observer) = crate::observer::installed() {
        executor = executor.with_observer(observer);
    }
    Ok(executor)
}

/// The one reading of Python values every executor shares.
fn python_reading() -> Arc<dyn Reading> {
    static READING: OnceLock<Arc<dyn Reading>> = OnceLock::new();
    Arc::clone(READING.get_or_init(|| Arc::new(PythonReading)))
}

/// Checks a `timeout=` given where it is given (`amap`'s, before its first item): a finite
/// number of seconds, 0 or more, as every run's timeout is.
#[pyfunction]
pub fn checked_timeout(seconds: &Bound<'_, PyAny>) -> PyResult<f64> {
    let refused = || {
        PyValueError::new_err(format!(
            "timeout must be a finite number of seconds, 0 or more, not {seconds}"
        ))
    };
    if seconds.is_instance_of::<pyo3::types::PyBool>() {
        return Err(refused());
    }
    let value: f64 = seconds.extract().map_err(|_| refused())?;
    time_limit(value)?;
    Ok(value)
}

/// A `timeout` in seconds as a duration: finite and not negative.
pub(crate) fn time_limit(seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        PyValueError::new_err(format!(
            "timeout must be a finite number of seconds, 0 or more, not {seconds}"
        ))
    })
}

/// The `TimeoutError` of a run whose time ran out, naming what was still running.
fn timed_out(error: &RunError, timeout: Option<Duration>) -> PyErr {
    let limit = timeout.map_or(0.0, |t| t.as_secs_f64());
    let still = left_behind(error);
    PyTimeoutError::new_err(format!(
        "forward did not finish within its timeout of {limit} s{still}\nhint: the graph can run again at once; a node that waits for something that may not come should wait with a timeout of its own"
    ))
}

/// What `pick` says of each node that it says something of, by id, in the order the nodes were
/// added: the listings of what is set per node (devices, retries, time limits).
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

/// The `soma.CancelledError` of a run whose stop flag was set, naming what was still running.
fn cancelled(py: Python<'_>, error: &RunError) -> PyErr {
    let still = left_behind(error);
    cancelled_error(py, format!("the run was stopped by its stop flag{still}"))
}

/// How many of the nodes a stopped run left running its message names.
const NAMED_LEFT_BEHIND: usize = 8;

/// The nodes a stopped run left running, as its message names them: a wave of thousands of
/// stuck branches names a few and counts the rest, so the message stays one readable line.
fn named_left_behind(running: &[NodeId]) -> String {
    let mut names: Vec<String> = running
        .iter()
        .take(NAMED_LEFT_BEHIND)
        .map(|id| format!("`{id}`"))
        .collect();
    if running.len() > NAMED_LEFT_BEHIND {
        names.push(format!("and {} more", running.len() - NAMED_LEFT_BEHIND));
    }
    names.join(", ")
}

/// What a run stopped early (its time ran out, its stop flag was set) left behind, as the
/// end of its message.
pub(crate) fn left_behind(error: &RunError) -> String {
    match error {
        RunError::Abandoned { running } if !running.is_empty() => format!(
            "; still running: {} (left to finish in the background, their results dropped)",
            named_left_behind(running)
        ),
        RunError::Abandoned { .. } => "; branches were left to finish in the background".to_owned(),
        RunError::Cancelled { running } if !running.is_empty() => {
            format!("; still running: {} (cancelled)", named_left_behind(running))
        }
        RunError::Cancelled { .. } | RunError::Interrupted => {
            "; every branch stopped at a node boundary".to_owned()
        }
        RunError::PastDeadline => {
            "; it finished after it, so its result was dropped (a deadline is never reported as met)"
                .to_owned()
        }
        other => format!("; the run had failed too: {other}"),
    }
}

/// The interpreter as the engine's host: a crew thread holds the GIL for the whole of each
/// branch it runs, with a thread state it keeps for its life (`thread_state.rs`), and every
/// blocking wait gives it back. Each branch runs at the nesting depth of its forward
/// (`reentry.rs`), on whichever thread.
struct Interpreter {
    depth: usize,
}

/// The hosts every run shares, one per nesting depth, each made the first time a run at its
/// depth asks (all thousand at once cost the first forward of a process about 12 µs); a crew
/// thread may still hold one after its run has ended.
static INTERPRETERS: [OnceLock<Arc<dyn Host>>; MAX_NESTED_FORWARDS + 1] =
    [const { OnceLock::new() }; MAX_NESTED_FORWARDS + 1];

/// The host for a run at nesting depth `depth` (`reentry.rs`): its branches run at that depth.
fn interpreter_at(depth: usize) -> Arc<dyn Host> {
    let depth = depth.min(MAX_NESTED_FORWARDS);
    Arc::clone(INTERPRETERS[depth].get_or_init(|| Arc::new(Interpreter { depth })))
}

/// Lets one branch thread at a time wait for the GIL to start its branch.
///
/// The interpreter's waiters wake every switch interval to ask for the lock: a wave of a
/// thousand branches, all waiting at once, spends its time waking threads that cannot run
/// (a fan-out of 1,000 one-node branches took 66–87 µs a branch on the 2-core benchmark
/// machine, most of it in the kernel's futex code; 30–45 µs with this queue). Queued here
/// instead, they sleep until it is their turn; the one in front waits for the GIL as any thread
/// does, and takes its turn whenever the holder lets go, so branches still overlap wherever
/// their work releases the GIL.
static STARTING: Mutex<()> = Mutex::new(());

impl Host for Interpreter {
    fn branch(&self, run: &mut dyn FnMut()) {
        // Before the queue: a thread that would enter a finalizing interpreter parks here.
        let _inside = exit::enter();
        let turn = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
        thread_state::keep();
        Python::attach(move |_| {
            drop(turn);
            Nested::carry(self.depth, run);
        });
    }

    fn blocking(&self, run: &mut (dyn FnMut() + Send)) {
        Python::attach(|py| py.detach(run));
    }

    fn capture(&self) -> Option<Box<dyn Captured>> {
        context::capture()
    }
}
