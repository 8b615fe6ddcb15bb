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
//!
//! The class's state and its bookkeeping — registering a node, compiling the plan and resolving
//! the program on first use — are here, with every setting written on a node by its id (device,
//! host, retries, time limit, concurrency) and whether the id may take it ([`State::settable`]). What Python calls on it is [`methods`]; copying a
//! decision step's sub-graph in is [`embed`]; what a forward runs with and how its outcome
//! reaches Python is [`run`], with a run's timeout and the errors of a run stopped early in
//! [`stopped`]; the interpreter as the engine's host is [`interpreter`].

mod embed;
mod interpreter;
mod methods;
mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;
use soma_core::{
    compile_decided, Catalog, Decisions, Graph, HostPlacement, Node, NodeId, Placement, Plan,
    Program, Route, Setting, DEFAULT_IDLE_THREADS,
};

use crate::errors::{compile_error, graph_error, program_error, unknown_node_error};
use crate::node::PythonNode;
use crate::policy::Written;
pub(crate) use interpreter::thread_stack_asked;
pub(crate) use run::{executor_for, refuse_inside_loop};

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
    /// Which nodes run on which host: read by the distribution step and the route a call
    /// takes, never by the program, which setting one leaves as it is.
    hosts: HostPlacement,
    /// How many items of a stream each node works on at once, where more than one: read when
    /// a stream starts, never by the program.
    concurrency: HashMap<NodeId, usize>,
    /// The `each`, `switch` and `loop` steps and the sub-graphs they run, whose nodes are in
    /// the catalog under ids namespaced by the step's (`chunks/clean`).
    decisions: Decisions,
    /// The graphs those sub-graphs were copied from, each with the prefix its ids were
    /// namespaced under: kept for the Python objects they hold, which a node inside is found
    /// by ([`GraphCore::implementation`]).
    bodies: Vec<(NodeId, Py<GraphCore>)>,
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
            hosts: HostPlacement::default(),
            concurrency: HashMap::new(),
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
        // An id inside a step holds the separator, which the graph refuses in an id: no node
        // registered here can take one.
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

    /// The plan, compiled on first use after a change.
    fn compiled_plan(&self, py: Python<'_>) -> PyResult<Arc<Plan>> {
        let mut state = self.state();
        Ok(Arc::clone(&Self::compiled(py, &mut state)?.plan))
    }

    /// The runner of one run of the graph ([`Route::of_one_run`]): the engine here, or the
    /// hosts when a node is placed on one.
    pub(crate) fn one_run_route(&self) -> Route {
        Route::of_one_run(!self.state().hosts.is_empty())
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
