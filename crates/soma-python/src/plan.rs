//! `soma.Plan`: a compiled plan, as Python sees it — a read-only tree that compares by structure.
//!
//! A `Plan` and every plan its `children` return share one immutable tree: asking a graph for
//! its cached plan, or a plan for its children, copies nothing, whatever the tree's size.

use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::prelude::*;
use soma_core::{Drawing, NodeId, Placement, Plan};

#[pyclass(frozen, module = "soma", name = "Plan")]
pub struct PyPlan {
    /// The whole tree, kept alive and never changed while any part of it is seen from Python.
    root: Arc<Plan>,
    /// The part this object is: the root itself or a subtree of it.
    at: NonNull<Plan>,
    /// Where the graph's nodes were placed when the plan was asked for: drawn, never compared.
    placement: Arc<Placement>,
    /// The nodes a run would find in the cache the plan was asked for with: drawn, never
    /// compared.
    cached: Option<Arc<HashSet<NodeId>>>,
}

// SAFETY: `at` points into the tree `root` owns; a `Plan` has no interior mutability and `root`
// is never mutated, so the pointee is as shareable across threads as `Plan` itself, which is
// `Send + Sync`.
#[allow(unsafe_code)]
unsafe impl Send for PyPlan {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for PyPlan {}

impl PyPlan {
    /// The whole of `root`, its nodes placed as `placement` says.
    pub fn new(root: Arc<Plan>, placement: Arc<Placement>) -> Self {
        let at = NonNull::from(&*root);
        PyPlan {
            root,
            at,
            placement,
            cached: None,
        }
    }

    /// The same plan, drawn with `cached`, the nodes a run would find in a cache.
    pub fn with_cached(mut self, cached: HashSet<NodeId>) -> Self {
        self.cached = Some(Arc::new(cached));
        self
    }

    /// The plan with what is drawn beside it: its nodes' devices, and which would hit.
    fn drawing(&self) -> Drawing<'_> {
        let drawing = self.plan().with_devices(&self.placement);
        match &self.cached {
            Some(cached) => drawing.with_cached(cached),
            None => drawing,
        }
    }

    /// The part of the tree this object is.
    pub fn subtree(&self) -> &Plan {
        self.plan()
    }

    /// Where the graph's nodes were placed, for drawing.
    pub fn devices(&self) -> Arc<Placement> {
        Arc::clone(&self.placement)
    }

    fn plan(&self) -> &Plan {
        // SAFETY: `at` points into the tree `self.root` owns and keeps alive, unchanged.
        #[allow(unsafe_code)]
        unsafe {
            self.at.as_ref()
        }
    }
}

#[pymethods]
impl PyPlan {
    /// `"Empty"`, `"Execute"`, `"Sequence"`, `"Wave"`, `"Remote"`, `"Map"`, `"Switch"` or
    /// `"Loop"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.plan().kind()
    }

    /// The steps of a `Sequence`, the branches of a `Wave`, the one slice of a `Remote`, the
    /// body of a `Map` or `Loop`, the cases of a `Switch`; empty otherwise.
    #[getter]
    fn children(&self) -> Vec<PyPlan> {
        self.plan()
            .children()
            .iter()
            .map(|child| PyPlan {
                root: Arc::clone(&self.root),
                at: NonNull::from(child),
                placement: Arc::clone(&self.placement),
                cached: self.cached.clone(),
            })
            .collect()
    }

    /// The host a `Remote` slice runs on; `None` otherwise.
    #[getter]
    fn host(&self) -> Option<&str> {
        self.plan().host().map(soma_core::HostName::as_str)
    }

    /// The node an `Execute` runs, or a `Map`, `Switch` or `Loop` step is; `None` otherwise.
    #[getter]
    fn node(&self) -> Option<&str> {
        self.plan().step().map(|(node, _)| node.as_str())
    }

    /// Where an `Execute`, `Map`, `Switch` or `Loop` step reads from, in edge-declaration
    /// order; empty means the graph's input.
    #[getter]
    fn inputs(&self) -> Vec<&str> {
        self.plan().step().map_or_else(Vec::new, |(_, from)| {
            from.iter().map(soma_core::NodeId::as_str).collect()
        })
    }

    /// The keys of a `Switch`'s cases, in the order of `children`; empty otherwise.
    #[getter]
    fn keys(&self) -> Vec<&str> {
        match self.plan() {
            Plan::Switch { keys, .. } => keys.iter().map(String::as_str).collect(),
            Plan::Empty
            | Plan::Execute { .. }
            | Plan::Sequence(_)
            | Plan::Wave(_)
            | Plan::Remote { .. }
            | Plan::Map { .. }
            | Plan::Loop { .. } => Vec::new(),
        }
    }

    /// How many items of a `Map` run at once at most (`None`: as many as the crew lends), or
    /// how many iterations a `Loop` may run; `None` for any other plan.
    #[getter]
    fn bound(&self) -> Option<usize> {
        match self.plan() {
            Plan::Map { in_flight, .. } => *in_flight,
            Plan::Loop { max_iterations, .. } => usize::try_from(*max_iterations).ok(),
            Plan::Empty
            | Plan::Execute { .. }
            | Plan::Sequence(_)
            | Plan::Wave(_)
            | Plan::Remote { .. }
            | Plan::Switch { .. } => None,
        }
    }

    /// The tree without ids: `Sequence([Execute, Wave([Execute, Execute])])`.
    fn shape(&self) -> String {
        self.plan().shape()
    }

    /// The tree on one line: `Sequence([Execute(a), Wave([Execute(b), Execute(c)])])`.
    fn __repr__(&self) -> String {
        self.plan().compact()
    }

    /// The indented tree, one line per step; an `Execute` line is `node <- inputs`, then
    /// `@ device` for a placed node and `(cached)` for one a run would find in the cache.
    fn __str__(&self) -> String {
        self.drawing().to_string()
    }

    /// The plan as a Mermaid `flowchart LR`, a `subgraph` per wave; a placed node's label
    /// says its device, and one a run would find in the cache says `(cached)`, filled apart.
    fn to_mermaid(&self) -> String {
        self.drawing().to_mermaid()
    }

    /// The plan as a graphviz `digraph` with `rankdir=LR`, a `cluster` per wave; a placed
    /// node's label says its device, and one a run would find in the cache says `(cached)`,
    /// filled apart.
    fn to_dot(&self) -> String {
        self.drawing().to_dot()
    }

    /// The plan drawn as an SVG document by Soma itself: waves framed, branches stacked; a
    /// placed node's box says its device, and one a run would find in the cache says
    /// `(cached)`, filled apart.
    fn to_svg(&self) -> String {
        self.drawing().to_svg()
    }

    /// The nodes a run would find in the cache this plan was asked for with, in plan order;
    /// `None` for a plan asked for without a cache.
    #[getter]
    fn cached(&self) -> Option<Vec<&str>> {
        let cached = self.cached.as_ref()?;
        Some(
            self.plan()
                .steps()
                .into_iter()
                .filter(|(node, _)| cached.contains(*node))
                .map(|(node, _)| node.as_str())
                .collect(),
        )
    }

    /// What a notebook shows: [`PyPlan::to_svg`].
    fn _repr_svg_(&self) -> String {
        self.to_svg()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyPlan>()
            .is_ok_and(|other| self.plan() == other.get().plan())
    }

    /// Itself: a plan never changes, so `copy.copy` has nothing to copy.
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Itself, as [`PyPlan::__copy__`]: nothing inside a plan can change either.
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.plan().compact().hash(&mut hasher);
        hasher.finish()
    }
}
